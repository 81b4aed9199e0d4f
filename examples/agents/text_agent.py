"""An agent on the OpenAI text-completions API (`client.completions.create`), trained by keel
unchanged: it writes its own prompt format (no chat template), and each later prompt extends
the last one with the answer it got, as a hand-written agent loop or a base-model harness does.

keel starts it once per episode with OPENAI_BASE_URL, OPENAI_API_KEY and KEEL_TASK (the row as
JSON). It asks the question, retries that call once (an exact repeat: keel answers it from its
record, never a second sample), asks for the final answer, and posts its reward. Options:
--rewrite ends with a fresh, shorter prompt (a rewritten history: keel trains it as a second
segment of the episode); --log DIR writes the prompts, answers and log-probs to
DIR/<api key>.json (used by keel's tests).
"""
import argparse
import json
import os
import re
import urllib.request

from openai import OpenAI


def post_reward(reward):
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/keel/reward",
        data=json.dumps({"reward": reward}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=30).read()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rewrite", action="store_true")
    parser.add_argument("--log")
    args = parser.parse_args()
    task = json.loads(os.environ["KEEL_TASK"])
    question = task["prompt"][-1]["content"]
    client = OpenAI(max_retries=0)
    prompts, replies = [], []

    def complete(prompt, max_tokens):
        reply = client.completions.create(model="policy", prompt=prompt, max_tokens=max_tokens,
                                          logprobs=0)
        prompts.append(prompt)
        replies.append(reply)
        return reply.choices[0].text

    first = f"Question: {question}\nWork:"
    draft = complete(first, 8)
    complete(first, 8)  # a retry of the same call
    answer = complete(first + draft + "\nSo the answer is", 6)
    if args.rewrite:
        answer = complete(f"Q: {question}\nA:", 6)
    numbers = re.findall(r"-?\d+", answer)
    reward = 1.0 if numbers and numbers[-1] == str(task["ground_truth"]) else 0.0
    post_reward(reward)
    if args.log:
        with open(os.path.join(args.log, os.environ["OPENAI_API_KEY"] + ".json"), "w") as f:
            json.dump({
                "prompts": prompts,
                "ids": [r.id for r in replies],
                "texts": [r.choices[0].text for r in replies],
                "logprobs": [r.choices[0].logprobs.token_logprobs for r in replies],
                "objects": [r.object for r in replies],
            }, f)


if __name__ == "__main__":
    main()
