#!/usr/bin/env python3
"""Reference reward service of keel's `env.reward_url` (standard library only).

keel's dataset env asks it for the reward of each final answer, in batches:

    GET  /health                        -> {"ok": true, "reward_fn": "..."}
    POST /score {"items": [{"data_source": str, "prompt": [{"role", "content"}...],
                            "response": str, "ground_truth": any, "extra_info": any}, ...]}
                                        -> {"rewards": [float in [0, 1], ...]}
    GET  /stats                         -> {"requests": n, "items": n, "largest_batch": n}

The reward function has verl's signature, so a verl `custom_reward_function` file works
unchanged:

    def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

(a dict's "score" is the reward). Without `--reward-fn` the built-in one scores 1 when the
response's last number (or, for a non-numeric truth, the whole trimmed response) equals the
ground truth. Run:

    python3 reward_server.py --port 8780                              # 0 picks a free port
    python3 reward_server.py --port 0 --reward-fn my_reward.py        # its compute_score
    python3 reward_server.py --port 0 --reward-fn my_reward.py:score  # another function name
    python3 reward_server.py --port 0 --flaky 3    # every 3rd /score request answers HTTP 503

The first line printed to stdout is `listening on PORT`.
"""

import argparse
import importlib.util
import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def default_score(data_source, solution_str, ground_truth, extra_info=None):
    """1.0 when the last number (or the trimmed text) of the response is the ground truth."""
    truth = str(ground_truth).strip()
    numbers = NUMBER.findall(solution_str.replace(",", ""))
    if NUMBER.fullmatch(truth):
        return 1.0 if numbers and float(numbers[-1]) == float(truth) else 0.0
    return 1.0 if solution_str.strip().lower() == truth.lower() else 0.0


def load_reward_fn(spec):
    """`path.py` or `path.py:function` -> the function (default name: compute_score)."""
    path, _, name = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location("keel_user_reward", path)
    if module_spec is None or module_spec.loader is None:
        raise SystemExit(f"cannot load the reward function file {path}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    fn = getattr(module, name or "compute_score", None)
    if not callable(fn):
        raise SystemExit(f"{path} defines no function {name or 'compute_score'}")
    return fn


class State:
    def __init__(self, reward_fn, flaky):
        self.reward_fn = reward_fn
        self.flaky = flaky
        self.lock = threading.Lock()
        self.requests = 0
        self.items = 0
        self.largest_batch = 0

    def score(self, items):
        rewards = []
        for item in items:
            out = self.reward_fn(item.get("data_source", ""), item.get("response", ""),
                                 item.get("ground_truth"), item.get("extra_info"))
            if isinstance(out, dict):
                out = out["score"]
            rewards.append(min(1.0, max(0.0, float(out))))
        with self.lock:
            self.items += len(items)
            self.largest_batch = max(self.largest_batch, len(items))
        return rewards


def make_handler(state):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def answer(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self.answer(200, {"ok": True, "reward_fn": state.reward_fn.__name__})
            elif self.path == "/stats":
                with state.lock:
                    self.answer(200, {"requests": state.requests, "items": state.items,
                                      "largest_batch": state.largest_batch})
            else:
                self.answer(404, {"error": f"no such path {self.path}"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            if self.path != "/score":
                self.answer(404, {"error": f"no such path {self.path}"})
                return
            with state.lock:
                state.requests += 1
                n = state.requests
            if state.flaky and n % state.flaky == 0:
                self.answer(503, {"error": "flaky by request (--flaky)"})
                return
            try:
                items = json.loads(raw)["items"]
                self.answer(200, {"rewards": state.score(items)})
            except Exception as e:  # the reward function's error is the caller's to see
                self.answer(400, {"error": f"{type(e).__name__}: {e}"})

    return Handler


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--port", type=int, default=8780)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--reward-fn", default="", help="path.py[:function] with verl's signature")
    p.add_argument("--flaky", type=int, default=0, help="every Nth /score answers HTTP 503")
    args = p.parse_args()
    reward_fn = load_reward_fn(args.reward_fn) if args.reward_fn else default_score
    server = ThreadingHTTPServer((args.host, args.port), make_handler(State(reward_fn, args.flaky)))
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
