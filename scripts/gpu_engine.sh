#!/usr/bin/env bash
# The vLLM backend on a GPU: generation tokens/s in the loop, keel's sampler vs vLLM, on a random
# Qwen2.5-0.5B-shaped bf16 model (scripts/python/make_qwen2_0p5b.py) at 1, 32 and 128 episodes
# per batch of multi-turn calc, with the weight swap time per version and the engine/trainer
# log-prob mismatch (scripts/python/bench_engine.py prints one table per batch size).
#
#   scripts/gpu_engine.sh build   # on the CPU machine: release `keel` with the CUDA link lines
#   scripts/gpu_engine.sh run     # on the GPU machine
#
# The GPU machine needs a CUDA build of vLLM 0.32 in an environment named by KEEL_VLLM_PYTHON
# (`pip install vllm==0.32.0` in its own venv); the machines lent to keel's sessions have no
# network, so it cannot be installed there from this script.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_common.sh
BIN=${KEEL_BIN:-target/release/keel}
PY=${PYTHON:-python3}
case "${1:-run}" in
  build)
    export LIBTORCH_USE_PYTORCH=1
    cargo build --release -p keel-ops
    gpu_built gpu_engine "$BIN"
    ;;
  run)
    gpu_runtime gpu_engine "$BIN"
    : "${KEEL_VLLM_PYTHON:?set KEEL_VLLM_PYTHON to the interpreter of a CUDA vLLM 0.32 environment}"
    "$KEEL_VLLM_PYTHON" -c 'import vllm; assert vllm.__version__.startswith("0.32."), vllm.__version__'
    OUT=$(mktemp -d -t keel-gpu-engine-XXXX)
    "$PY" scripts/python/make_qwen2_0p5b.py "$OUT/model"
    for shape in "1 1" "8 4" "32 4"; do
      set -- $shape
      "$PY" scripts/python/bench_engine.py --keel "$BIN" --vllm-python "$KEEL_VLLM_PYTHON" \
        --model "$OUT/model" --out "$OUT/b$1x$2" --device cuda --dtype bfloat16 \
        --steps 3 --tasks "$1" --group "$2" --max-turn-tokens 128 --context 1024
    done
    ;;
  *) echo "usage: scripts/gpu_engine.sh build|run" >&2; exit 2 ;;
esac
