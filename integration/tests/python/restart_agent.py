"""An agent that lives through a keel restart (the agent journal's test, AJ-3).

A training episode's agent makes its first call with an Idempotency-Key, writes
LOGS/<key>.first (the test's progress condition: that answer is in keel's journal, AJ-1), then
waits for LOGS/go, which the test writes once it has SIGKILLed keel and started it again. It
retries its first call with the same key (the restarted keel must give back the recorded
answer, never a second sample), asks a follow-up, posts its reward and exits. Every answer it
got is in LOGS/<key>.json; an agent that fails writes why to LOGS/<key>.error. Evaluation episodes run straight through.

The client retries a refused connection for minutes (max_retries=40), as an agent that should
outlive a trainer restart must.
"""
import json
import os
import sys
import time
import urllib.request

from openai import OpenAI


def answer(reply):
    choice = reply.choices[0]
    content = choice.logprobs.content if choice.logprobs else []
    return {"id": reply.id, "content": choice.message.content,
            "completion_tokens": reply.usage.completion_tokens,
            "logprobs": [t.logprob for t in content or []]}


def post_reward(reward):
    url = os.environ["OPENAI_BASE_URL"].rstrip("/") + "/keel/reward"
    request = urllib.request.Request(
        url, data=json.dumps({"reward": reward}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=60).read()


def main():
    logs = sys.argv[1]
    key = os.environ["OPENAI_API_KEY"]
    task = json.loads(os.environ["KEEL_TASK"])
    client = OpenAI(max_retries=40, timeout=600)
    messages = [{"role": m["role"], "content": m["content"]} for m in task["prompt"]]

    def call(idempotency_key):
        return client.chat.completions.create(
            model="policy", messages=messages, logprobs=True,
            extra_headers={"Idempotency-Key": idempotency_key})

    first = answer(call(key[-12:] + "-1"))
    answers = [first]
    if task["split"] == "train":
        open(os.path.join(logs, key + ".first"), "w").close()
        while not os.path.exists(os.path.join(logs, "go")):
            time.sleep(0.1)
        answers.append(answer(call(key[-12:] + "-1")))
    messages.append({"role": "assistant", "content": first["content"]})
    messages.append({"role": "user", "content": "Check it and give only the final number."})
    last = answer(call(key[-12:] + "-2"))
    answers.append(last)
    # The log is written before the reward: the reward ends the episode, and keel may end the
    # run (and the test read the logs) before a later write lands.
    with open(os.path.join(logs, key + ".json"), "w") as f:
        json.dump({"split": task["split"], "answers": answers}, f)
    truth = str(task["ground_truth"])
    post_reward(1.0 if (last["content"] or "").strip() == truth else 0.0)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the test names why an agent did not finish
        with open(os.path.join(sys.argv[1], os.environ["OPENAI_API_KEY"] + ".error"), "w") as f:
            f.write(repr(e))
        raise
