"""Runs an unchanged agent program on episodes pulled from a keel gateway on another host.

With `[env.agent] launch = "pull"`, `keel train` starts no agents: it offers each episode at
POST $GATEWAY/keel/episodes/next. This worker takes episodes from there, runs the agent command
once per episode exactly as keel's own `launch = "spawn"` would (OPENAI_BASE_URL, OPENAI_API_KEY
= the episode's key, KEEL_TASK = the row as JSON, also on stdin), then reports the end at
POST $GATEWAY/keel/episodes/end ({"error": ...} when the agent exited non-zero). The agent posts
its own reward as usual.

  KEEL_AGENT_POOL_KEY=<secret> python3 pool_worker.py --gateway http://HOST:PORT/v1 \
      --workers 8 -- python3 calculator_agent.py

It stops when the gateway has been unreachable for --patience seconds (the run ended).
"""
import argparse
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request


def post(url, token, body):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        text = reply.read().decode()
        return reply.status, (json.loads(text) if text else None)


def run_episode(gateway, episode, command):
    task = json.dumps(episode["task"])
    env = dict(os.environ, OPENAI_BASE_URL=gateway, OPENAI_API_KEY=episode["key"], KEEL_TASK=task)
    env.pop("KEEL_AGENT_POOL_KEY", None)  # the agent needs its episode's key only
    agent = subprocess.run(command, input=task.encode(), env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
    end = {} if agent.returncode == 0 else {
        "error": f"exit {agent.returncode}: {agent.stderr.decode(errors='replace')[-2000:]}"}
    try:
        post(gateway.rstrip("/") + "/keel/episodes/end", episode["key"], end)
    except urllib.error.HTTPError:
        pass  # the episode already ended on keel's side (timeout, call budget)


def work(gateway, pool_key, command, patience, done):
    unreachable_since = None
    while True:
        try:
            status, episode = post(gateway.rstrip("/") + "/keel/episodes/next", pool_key,
                                   {"wait_s": 5})
            unreachable_since = None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            if isinstance(e, urllib.error.HTTPError):
                raise
            unreachable_since = unreachable_since or time.time()
            if time.time() - unreachable_since > patience:
                return
            time.sleep(0.2)
            continue
        if status == 200:
            run_episode(gateway, episode, command)
            done.append(episode["key"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gateway", required=True, help="the gateway's base URL, .../v1")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--patience", type=float, default=10.0)
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()
    pool_key = os.environ["KEEL_AGENT_POOL_KEY"]
    done = []
    threads = [threading.Thread(target=work, args=(args.gateway, pool_key, args.command,
                                                   args.patience, done))
               for _ in range(args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"episodes": len(done)}))


if __name__ == "__main__":
    main()
