"""keel's built-in sampler against the vLLM backend, in the loop: the same `keel train` job on
calc (SFT, then RL steps) once per backend, read back from each run's metrics log.

Prints, per backend: sampled tokens, seconds spent sampling, tokens/s, the ratio vLLM / keel,
the mean engine/trainer log-prob mismatch (`rollout_logp_mismatch`, learner.rollout_is = token),
and for vLLM the weight swap time per version (materialise + reload + cache reset + probe).

usage: bench_engine.py --keel BIN --vllm-python PY --model DIR [--device cpu|cuda]
                       [--dtype float32|bfloat16] [--steps N] [--tasks N] [--group N]
                       [--max-turn-tokens N] [--context N] [--out DIR]
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

CONFIG = """
[run]
name = "bench-{backend}"
seed = 7
steps = {steps}
mode = "sync"
checkpoint_every = {steps}
device = "{device}"

[env]
name = "calc"
difficulty = 1

[model]
context_len = {context}
dtype = "{dtype}"

[sft]
steps = 2
batch_size = 8
demos = 16

[rollout]
tasks_per_batch = {tasks}
group_size = {group}
max_turn_tokens = {max_turn_tokens}
eval_tasks = 1
eval_samples = 0
batch_invariant = "off"
backend = "{backend}"

[rollout.vllm]
python = "{vllm_python}"

[learner]
algo = "grpo"
ratio_base = "recompute"
rollout_is = "token"

[metrics]
enabled = false

[guard]
enabled = false
"""


def run(args, backend, out):
    root = os.path.join(out, backend)
    cfg = os.path.join(out, f"{backend}.toml")
    with open(cfg, "w") as f:
        f.write(CONFIG.format(backend=backend, vllm_python=args.vllm_python, steps=args.steps,
                              device=args.device, dtype=args.dtype, context=args.context,
                              tasks=args.tasks, group=args.group,
                              max_turn_tokens=args.max_turn_tokens))
    env = dict(os.environ, KEEL_LOG="warn,keel_actors::vllm=info")
    started = time.time()
    proc = subprocess.run([args.keel, "train", "--config", cfg, "--run-root", root, "--model",
                           args.model, "--no-progress"], env=env, capture_output=True, text=True)
    wall = time.time() - started
    if proc.returncode != 0:
        sys.exit(f"{backend}: keel train failed:\n{proc.stderr[-3000:]}")
    tokens = seconds = 0.0
    mismatch = []
    for path in sorted(glob.glob(os.path.join(root, "metrics", "*", "*.jsonl"))):
        for line in open(path):
            ev = json.loads(line)
            if ev.get("event") == "rollout":
                tokens += ev.get("sampled_tokens", 0)
                seconds += ev.get("sample_seconds", 0.0)
            elif ev.get("event") == "step":
                mismatch.append(ev["metrics"].get("rollout_logp_mismatch", 0.0))
    swaps = [float(m) for m in re.findall(r"swap_seconds=([0-9.eE+-]+)", proc.stderr)]
    return {"tokens": tokens, "seconds": seconds, "wall": wall, "swaps": swaps,
            "mismatch": sum(mismatch) / max(len(mismatch), 1)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--keel", required=True)
    p.add_argument("--vllm-python", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--max-turn-tokens", type=int, default=48)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="keel-bench-engine-")
    rows = {b: run(args, b, out) for b in ("keel", "vllm")}
    print(f"{args.steps} RL steps on calc, {args.tasks}x{args.group} episodes per batch, "
          f"{args.device} {args.dtype}, model {args.model}")
    print(f"{'backend':8} {'tokens':>8} {'sample s':>9} {'tokens/s':>9} {'wall s':>7} "
          f"{'mismatch':>9} {'swap s/version':>15}")
    for b, r in rows.items():
        rate = r["tokens"] / r["seconds"] if r["seconds"] else float("nan")
        swap = (f"{sum(r['swaps']) / len(r['swaps']):.3f}" if r["swaps"] else "-")
        print(f"{b:8} {r['tokens']:8.0f} {r['seconds']:9.2f} {rate:9.1f} {r['wall']:7.1f} "
              f"{r['mismatch']:9.2e} {swap:>15}")
    k, v = rows["keel"], rows["vllm"]
    if k["seconds"] and v["seconds"] and k["tokens"]:
        ratio = (v["tokens"] / v["seconds"]) / (k["tokens"] / k["seconds"])
        print(f"vllm / keel generation tokens/s in the loop: {ratio:.2f}x")


if __name__ == "__main__":
    main()
