"""An agent that misbehaves in one of six ways, for keel's agent-gateway test (issue 34).

Each run claims the next slot number in DIR (a file created exclusively) and behaves by slot
mod 6, so any six consecutive episodes see every behaviour; what it observed goes to
DIR/<slot>.json for the test to read:
  0 good: answers through the real openai client and posts its reward
  1 probe: malformed JSON, no key, an unknown key, an oversized body, another temperature
    (each must be refused with a clear HTTP status and the episode goes on), then a good call
    with max_tokens = 2 and an Idempotency-Key, its exact retry and a changed call with the
    same key (both must return the stored answer), a call with stop sequences (the answer must
    hold none), and the reward
  2 prefill: a good call, then a call that ends with an assistant message (400), exits
    without reward
  3 hang: a good call, then sleeps until killed (env.agent.timeout_s)
  4 early exit: exits before its first call
  5 no reward: a good call, then exits 0 without posting a reward
Usage: hostile_agent.py DIR
"""
import json
import os
import sys
import time
import urllib.error
import urllib.request

from openai import OpenAI, BadRequestError

DIR = sys.argv[1]
BASE = os.environ["OPENAI_BASE_URL"].rstrip("/")
KEY = os.environ["OPENAI_API_KEY"]


def claim_slot():
    n = 0
    while True:
        try:
            os.close(os.open(os.path.join(DIR, f"slot-{n}"), os.O_CREAT | os.O_EXCL))
            return n
        except FileExistsError:
            n += 1


def post(path, body, key=KEY):
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = "Bearer " + key
    request = urllib.request.Request(BASE + path, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def chat(client, messages, **kw):
    reply = client.chat.completions.create(model="policy", messages=messages, **kw)
    message = reply.choices[0].message
    return message.content or "", message.model_dump(exclude_none=True), reply


STOPS = [" ", "e", "a", "o"]


def reward(value):
    status, _ = post("/keel/reward", json.dumps({"reward": value}).encode())
    return status


def main():
    slot = claim_slot()
    kind = ["good", "probe", "prefill", "hang", "early_exit", "no_reward"][slot % 6]
    seen = {"kind": kind, "pid": os.getpid()}

    def log():
        with open(os.path.join(DIR, f"{slot}.json"), "w") as f:
            json.dump(seen, f)

    log()
    if kind == "early_exit":
        return
    task = json.loads(os.environ["KEEL_TASK"])
    messages = [{"role": m["role"], "content": m["content"]} for m in task["prompt"]]
    client = OpenAI(max_retries=0)
    if kind == "probe":
        call = json.dumps({"model": "policy", "messages": messages}).encode()
        seen["malformed"] = post("/chat/completions", b"{not json")[0]
        seen["no_key"] = post("/chat/completions", call, key=None)[0]
        seen["unknown_key"] = post("/chat/completions", call, key="k" * 32)[0]
        huge = json.dumps({"model": "policy", "messages": [
            {"role": "user", "content": "x" * 200_000}]}).encode()
        seen["huge"] = post("/chat/completions", huge)[0]
        try:
            chat(client, messages, temperature=0.25)
            seen["temperature"] = 200
        except BadRequestError as e:
            seen["temperature"] = e.status_code
        log()  # what the probe saw so far survives a kill at the episode's timeout
    capped = {"max_tokens": 2, "extra_headers": {"Idempotency-Key": "probe-1"}}
    answer, message, first = chat(client, messages, **(capped if kind == "probe" else {}))
    seen["answer"] = answer
    if kind == "probe":
        seen["capped_tokens"] = first.usage.completion_tokens
        seen["retry_same"] = chat(client, messages)[0] == answer
        changed = messages + [message, {"role": "user", "content": "Are you sure?"}]
        _, _, again = chat(client, changed, **capped)
        seen["retry_key"] = (again.id, again.choices[0].message.content or "") == \
            (first.id, answer)
        stopped, _, _ = chat(client, changed, stop=STOPS)
        seen["stop_cut"] = not any(s in stopped for s in STOPS)
    if kind == "prefill":
        prefilled = messages + [message, {"role": "assistant", "content": "The answer is"}]
        status, _ = post("/chat/completions",
                         json.dumps({"model": "policy", "messages": prefilled}).encode())
        seen["prefill"] = status
        log()
        return
    if kind == "hang":
        log()
        time.sleep(3600)
        return
    if kind == "no_reward":
        log()
        return
    seen["reward_status"] = reward(1.0 if answer.strip() == str(task["ground_truth"]) else 0.0)
    log()


if __name__ == "__main__":
    main()
