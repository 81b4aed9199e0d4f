"""Writes the arena's arithmetic questions (recipes/arena/data/arithmetic.{train,test}.jsonl).

Short one-digit questions ("What is 7 times 8? Reply with only the number.") for keel's
real-model arena grid (recipes/arena/smollm2.toml). SmolLM2-135M-Instruct partly solves them:
within 12 tokens, greedy 21 of 32 held-out questions, sampled at temperature 1 about 0.19 (it
often answers at length, or wrongly), so RL has something to teach in a few steps and something
to lose. Measured with transformers when the files were written. Rows are
verl-shaped (chat `prompt`, `data_source`, `reward_model.ground_truth`) and scored by keel's
`numeric` verifier (the response's last number). Deterministic: the same seeds write the same
files, and no held-out question is a training question.

    python3 scripts/python/make_arithmetic.py recipes/arena/data
"""

import json
import random
import sys
from pathlib import Path

INSTRUCTION = " Reply with only the number."


def question(rng: random.Random) -> tuple[str, int]:
    kind = rng.randrange(3)
    if kind == 0:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        return f"What is {a} plus {b}?", a + b
    if kind == 1:
        b = rng.randint(1, 9)
        a = b + rng.randint(1, 9)
        return f"What is {a} minus {b}?", a - b
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return f"What is {a} times {b}?", a * b


def rows(n: int, seed: int, exclude: set[str]) -> list[dict]:
    rng = random.Random(seed)
    out, seen = [], set(exclude)
    while len(out) < n:
        text, answer = question(rng)
        if text in seen:
            continue
        seen.add(text)
        out.append({
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": text + INSTRUCTION}],
            "reward_model": {"style": "rule", "ground_truth": str(answer)},
            "extra_info": {"index": len(out)},
        })
    return out


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    train = rows(160, 1, set())
    test = rows(32, 2, {r["prompt"][0]["content"].removesuffix(INSTRUCTION) for r in train})
    for name, data in (("train", train), ("test", test)):
        with open(out / f"arithmetic.{name}.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in data)


if __name__ == "__main__":
    main()
