#!/usr/bin/env bash
# `keel train --model DIR` on a GPU: a random Qwen2-0.5B-shaped folder (scripts/python/
# make_qwen2_0p5b.py) trained with GRPO on `calc` for a few minutes, on CUDA, bf16 parameters
# and activations with f32 master weights (model.dtype; KEEL_GPU_DTYPE=float32 for f32).
# Prints what the issue asks to record in BENCHMARKS.md: generation tokens/s in the loop (the
# generator's Prometheus gauge, sampled while it runs), learner tokens/s and its MFU against the
# given peak, seconds per step, and peak GPU memory (nvidia-smi, sampled every second).
#
#   scripts/gpu_train.sh build   # on the CPU machine: release build with the CUDA link lines
#   scripts/gpu_train.sh run     # on the GPU machine (torch 2.11 + transformers, no Rust)
#
# The device tool carries the binary: run `scripts/gpu_train.sh build`, then call the device with
# carry ["target/release/keel"] and command `bash scripts/gpu_train.sh run`.
# Environment: KEEL_GPU_STEPS (default 20), KEEL_GPU_PEAK_TFLOPS (default 792, the H200 bf16
# matmul peak measured by scripts/gpu_bench.sh), KEEL_GPU_DTYPE (default bfloat16),
# KEEL_GPU_CHECKPOINTING (default false: learner.activation_checkpointing).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_common.sh
BIN=${KEEL_BIN:-target/release/keel}
PY=${PYTHON:-python3}
STEPS=${KEEL_GPU_STEPS:-20}
PEAK=${KEEL_GPU_PEAK_TFLOPS:-792}
DTYPE=${KEEL_GPU_DTYPE:-bfloat16}
CHECKPOINTING=${KEEL_GPU_CHECKPOINTING:-false}

case "${1:-run}" in
  build)
    export LIBTORCH_USE_PYTORCH=1
    cargo build --release -p keel-ops
    gpu_built gpu_train "$BIN"
    ;;
  run)
    gpu_runtime gpu_train "$BIN"
    WORK=$(mktemp -d)
    "$PY" scripts/python/make_qwen2_0p5b.py "$WORK/model"
    PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    cat > "$WORK/gpu.toml" <<TOML
[run]
name = "gpu-train"
steps = $STEPS
checkpoint_every = 1000000
device = "cuda"

[env]
name = "calc"
difficulty = 2

[model]
context_len = 1024
dtype = "$DTYPE"

[sft]
steps = 0

[rollout]
tasks_per_batch = 32
group_size = 8
max_turn_tokens = 32
eval_tasks = 64

[metrics]
port = $PORT

[learner]
algo = "grpo"
minibatches = 2
max_tokens_per_microbatch = 8192
activation_checkpointing = $CHECKPOINTING
TOML
    ( while sleep 1; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1; done ) > "$WORK/mem.txt" &
    MEM_PID=$!
    ( while sleep 2; do curl -s "http://127.0.0.1:$PORT/metrics" | grep '^keel_perf_generated_tokens_per_second' || true; done ) > "$WORK/gen.txt" &
    GEN_PID=$!
    START=$(date +%s)
    "$BIN" train --no-progress --config "$WORK/gpu.toml" --model "$WORK/model" --run-root "$WORK/run" \
      --summary-json "$WORK/summary.json" > "$WORK/train.log" 2>&1 || { tail -20 "$WORK/train.log"; kill $MEM_PID $GEN_PID; exit 1; }
    END=$(date +%s)
    kill $MEM_PID $GEN_PID 2>/dev/null || true
    "$PY" - "$WORK" "$PEAK" "$((END - START))" <<'PY'
import json, sys
work, peak, wall = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
cfg = json.load(open(f"{work}/model/config.json"))
h, i, l, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
params = v * h + l * (h * (h + 2 * kv) + h * h + 3 * h * i)
steps = [json.loads(x) for x in open(f"{work}/run/metrics.jsonl") if '"event":"step"' in x]
ms = [s["metrics"] for s in steps[2:]] or [s["metrics"] for s in steps]
tps = sum(m["tokens_per_s"] for m in ms) / len(ms)
sec = sum(m["step_seconds"] for m in ms) / len(ms)
gen = [float(x.split()[-1]) for x in open(f"{work}/gen.txt") if x.strip()]
mem = [int(x) for x in open(f"{work}/mem.txt") if x.strip().isdigit()]
print(f"steps {len(steps)}  wall {wall} s  (~{wall / max(1, len(steps)):.1f} s per step, rollout included)")
print(f"learner: {tps:,.0f} tokens/s, {sec:.2f} s per update; MFU {6 * params * tps / (peak * 1e12):.1%} of {peak:.0f} TFLOP/s ({params / 1e6:.0f}M params)")
print(f"generation in the loop: {max(gen) if gen else float('nan'):,.0f} tokens/s (best sample of the gauge)")
print(f"peak GPU memory: {max(mem) if mem else 'n/a'} MiB")
PY
    ;;
  *)
    echo "usage: scripts/gpu_train.sh build|run" >&2
    exit 2
    ;;
esac
