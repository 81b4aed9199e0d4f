#!/usr/bin/env bash
# keel's model layer on a GPU versus PyTorch eager and transformers generate(), bf16, on a random
# Qwen2-0.5B-shaped model (24 layers, hidden 896, 14/2 heads, vocab 151,936, tied embeddings):
#   - learner step (batch 8 x 1024, AdamW): tokens/s of keel and PyTorch eager, the ratio, and
#     both model FLOPs utilisations against the measured bf16 matmul peak;
#   - sampler (prompt 128, 256 new tokens, greedy, KV cache) at batch 1 and 128: tokens/s of keel
#     and transformers generate(), and the ratios.
# Runs in well under 5 minutes on an H200.
#
#   scripts/gpu_bench.sh build   # on the CPU machine: release build with the CUDA link lines
#   scripts/gpu_bench.sh run     # on the GPU machine (torch 2.11 + transformers, no Rust needed)
#
# The device tool carries the binary: run `scripts/gpu_bench.sh build`, then call the device with
# carry ["target/release/keel-bench-model"] and command `bash scripts/gpu_bench.sh run`
# (see ../shared/setup/NOTES.md, "GPU machines").
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_common.sh
BIN=${KEEL_BENCH_BIN:-target/release/keel-bench-model}
PY=${PYTHON:-python3}

case "${1:-run}" in
  build)
    export LIBTORCH_USE_PYTORCH=1
    cargo build --release -p keel-learner --bin keel-bench-model
    # learner/build.rs links libtorch_cuda with --no-as-needed; without it CUDA is invisible.
    gpu_built gpu_bench "$BIN"
    ;;
  run)
    gpu_runtime gpu_bench "$BIN"
    export KEEL_BENCH_PY=learner/tests/python/bench_torch.py
    "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "gpu", torch.cuda.get_device_name(0))'
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
    "$BIN" --shape qwen2-0.5b --device cuda --dtype bfloat16 --threads "$(nproc)" \
      --batch 8 --seq 1024 --steps 5 --warmup 2 \
      --gen-batches 1,128 --prompt 128 --new 256 --repeat 1 --peak
    ;;
  *)
    echo "usage: scripts/gpu_bench.sh build|run" >&2
    exit 2
    ;;
esac
