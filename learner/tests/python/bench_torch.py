"""The PyTorch side of keel's model benchmarks (run by the keel-bench-model binary).

  bench_torch.py make OUT --shape {cpu-small,qwen2-0.5b} --dtype {float32,bfloat16}
      saves a random Qwen2-shaped model made by transformers into OUT.
  bench_torch.py learner MODEL --device D --dtype T --batch B --seq S --steps N --warmup W
      PyTorch eager learner step: forward, f32 log-softmax of the next tokens, mean NLL,
      backward, AdamW (lr 1e-5, PyTorch defaults otherwise), zero_grad; the fastest of N
      timed steps. Prints JSON.
  bench_torch.py generate MODEL --device D --dtype T --batch B --prompt P --new N
      transformers generate() with the KV cache, greedy, exactly N new tokens, best of
      --repeat runs. Prints JSON.
  bench_torch.py peak --device D --dtype T
      measured dense matmul throughput (TFLOP/s) for MFU. Prints JSON.
Every command takes --threads (torch intra-op threads, matched to keel's).
"""
import argparse
import json
import time

import torch

SHAPES = {
    # A small Qwen2-shaped model that runs in seconds on 2 CPU cores.
    "cpu-small": dict(vocab_size=8192, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    # Qwen2.5-0.5B's shape.
    "qwen2-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
}
DTYPES = {"float32": torch.float32, "f32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def load(args):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(args.model, dtype=DTYPES[args.dtype]).to(args.device)


def make(args):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(**SHAPES[args.shape], max_position_embeddings=4096, rope_theta=1000000.0,
                      rms_norm_eps=1e-6, eos_token_id=None, bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(args.device):
        model = Qwen2ForCausalLM(cfg).to(DTYPES[args.dtype])
    model.save_pretrained(args.out)
    return {"params": sum(p.numel() for p in model.parameters())}


def learner(args):
    model = load(args).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), generator=g).to(args.device)

    def step():
        logits = model(input_ids=ids).logits
        lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])
        loss = -lp.mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss

    for _ in range(args.warmup):
        step()
    sync(args.device)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        sync(args.device)
        times.append(time.perf_counter() - t0)
    best = min(times)  # the fastest step: robust to other load on the machine
    return {"tokens_per_s": args.batch * args.seq / best, "step_s": best, "loss": float(loss)}


def generate(args):
    model = load(args).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt), generator=g).to(args.device)
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=args.new, min_new_tokens=args.new,
              do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        sync(args.device)
        dt = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            out = model.generate(ids, **kw)
            sync(args.device)
            dt = min(dt, time.perf_counter() - t0)
    new = (out.shape[1] - args.prompt) * args.batch
    return {"tokens_per_s": new / dt, "seconds": dt, "new_tokens": new}


def peak(args):
    n = 8192 if args.device.startswith("cuda") else 1024
    a = torch.randn(n, n, dtype=DTYPES[args.dtype], device=args.device)
    b = torch.randn(n, n, dtype=DTYPES[args.dtype], device=args.device)
    for _ in range(3):
        a @ b
    sync(args.device)
    reps = 50 if args.device.startswith("cuda") else 5
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(args.device)
    return {"tflops": 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["make", "learner", "generate", "peak"])
    p.add_argument("model", nargs="?")
    p.add_argument("--out")
    p.add_argument("--shape", default="cpu-small")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=0)
    for k, v in [("batch", 4), ("seq", 256), ("steps", 5), ("warmup", 2), ("prompt", 32), ("new", 64), ("repeat", 3)]:
        p.add_argument("--" + k, type=int, default=v)
    args = p.parse_args()
    if args.cmd == "make":
        args.out = args.out or args.model
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    print(json.dumps({"make": make, "learner": learner, "generate": generate, "peak": peak}[args.cmd](args)))


if __name__ == "__main__":
    main()
