#!/usr/bin/env bash
# Learner ranks on GPUs over NCCL (issue 36): learner tokens/s, scaling efficiency, the
# collectives' share of step time, memory per rank and the weights' distance from one rank after
# the same GRPO updates, for 1, 2, 4, 8 ranks (as many as the machine has GPUs; rank R on GPU R),
# against one rank measured in the same run. f32 weights, a random Llama-shaped model (8 layers,
# hidden 1024, vocab 32,768: 168M parameters), global batch 32 x 512, 5 timed updates.
# With one GPU it runs one rank joined to a one-rank NCCL group (a smoke test of the binding:
# the buckets and weights go through ProcessGroupNCCL) after the plain one-rank baseline.
#
#   scripts/gpu_learner.sh build   # on the CPU machine: release build with the CUDA link lines
#   scripts/gpu_learner.sh run     # on the GPU machine (torch 2.11 with CUDA, no Rust needed)
#
# The device tool carries the binary: run `scripts/gpu_learner.sh build`, then call the device
# with carry ["target/release/keel-bench-learner-ranks"] and command
# `bash scripts/gpu_learner.sh run` (see ../shared/setup/NOTES.md, "GPU machines").
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_common.sh
BIN=${KEEL_BENCH_BIN:-target/release/keel-bench-learner-ranks}
PY=${PYTHON:-python3}
SHAPE=(--hidden 1024 --layers 8 --vocab 32768 --batch 32 --seq 512 --steps 5 --threads 4 --device cuda)

case "${1:-run}" in
  build)
    export LIBTORCH_USE_PYTORCH=1
    cargo build --release -p keel-learner --bin keel-bench-learner-ranks
    # The shim names ProcessGroupNCCL, so the binary must link libtorch_cuda (learner/build.rs).
    gpu_built gpu_learner "$BIN"
    ;;
  run)
    gpu_runtime gpu_learner "$BIN"
    GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
    "$PY" -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0))'
    if [ "$GPUS" -ge 2 ]; then
      RANKS=1
      for n in 2 4 8; do [ "$n" -le "$GPUS" ] && RANKS="$RANKS,$n"; done
      "$BIN" --ranks "$RANKS" "${SHAPE[@]}"
      "$BIN" --ranks "$RANKS" "${SHAPE[@]}" --reduce bf16
    else
      echo "one GPU: ranks need one GPU each; the one-rank baseline, then one rank over a one-rank NCCL group"
      "$BIN" --ranks 1 "${SHAPE[@]}"
      "$BIN" --ranks 1 "${SHAPE[@]}" --join-alone 1
    fi
    nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader || true
    ;;
  *)
    echo "usage: scripts/gpu_learner.sh build|run" >&2
    exit 2
    ;;
esac
