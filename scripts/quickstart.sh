#!/usr/bin/env bash
# Sets up the machine, builds keel and runs the quickstart training job on built-in defaults:
# SFT warm start on noised oracle demonstrations, held-out eval, GRPO, held-out eval again.
# Extra arguments go to `keel train` (e.g. --run-root s3://bucket/prefix, --config FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
cargo build --release -p keel-ops
exec target/release/keel train "$@"
