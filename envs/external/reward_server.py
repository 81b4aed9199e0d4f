#!/usr/bin/env python3
"""Reference reward service of keel's `env.dataset.reward.url` (standard library only).

keel's dataset env asks it for the reward of each model response that ends an episode, in
batches:

    GET  /health                        -> 200 {"ok": true, "reward_fn": "...", "signature": ...}
                                           503 {"ok": false, "error": "..."} (refused function)
    POST /score {"items": [{"data_source": str, "prompt": [{"role", "content"}...],
                            "response": str, "ground_truth": any, "extra_info": any}, ...]}
                                        -> {"rewards": [float, ...]}
    GET  /stats                         -> {"requests": n, "items": n, "largest_batch": n}

The reward function is called exactly as verl calls one (verl's `NaiveRewardManager` with
`custom_reward_function.path/name/reward_kwargs`): by keyword, with the whole decoded
response as `solution_str` (keel sends it untrimmed, reasoning included), and the
`--reward-kwargs` merged in (they win over keel's). Two signatures are accepted, found once
when the file is loaded:

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)
        # verl's custom reward function / default_compute_score:
        #   fn(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs)
    def compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0)
        # a per-source scorer such as verl/utils/reward_score/gsm8k.py:
        #   fn(solution_str=, ground_truth=, **reward_kwargs)  (+ extra_info= if it takes one)

A function that fits neither, or does not accept the `--reward-kwargs`, is refused at startup:
the error is printed to stderr and `/health` answers 503 with it, so keel's startup probe fails
before any episode runs. `async def` functions are awaited.

Rewards are never clamped: a float, an int or a bool, or a dict whose "score" is one, is passed
through as a float (verl's `math_dapo` -1, format penalties). A NaN or infinite reward, another
type, or an exception of the function fails the whole `/score` request with HTTP 400 naming the
item, so those episodes fail in keel: no reward is invented. Without `--reward-fn` the built-in
one scores 1 when the response's last number (or, for a non-numeric truth, the whole trimmed
response) equals the ground truth. Run:

    python3 reward_server.py --port 8780                              # 0 picks a free port
    python3 reward_server.py --port 0 --reward-fn my_reward.py        # its compute_score
    python3 reward_server.py --port 0 --reward-fn my_reward.py:score  # another function name
    python3 reward_server.py --port 0 --reward-fn gsm8k.py --reward-kwargs '{"method": "flexible"}'
    python3 reward_server.py --port 0 --flaky 3    # every 3rd /score request answers HTTP 503

The first line printed to stdout is `listening on PORT`.
"""

import argparse
import asyncio
import importlib.util
import inspect
import json
import math
import numbers
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
VERL = "verl"              # fn(data_source=, solution_str=, ground_truth=, extra_info=, **kw)
PER_SOURCE = "per-source"  # fn(solution_str=, ground_truth=, **kw)


def default_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
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
        raise ValueError(f"cannot load the reward function file {path}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    fn = getattr(module, name or "compute_score", None)
    if not callable(fn):
        raise ValueError(f"{path} defines no function {name or 'compute_score'}")
    return fn


def call_style(fn, reward_kwargs):
    """VERL or PER_SOURCE: how `fn` is called; ValueError naming why when it fits neither."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise ValueError(f"cannot read the signature of {fn.__name__}: {e}")
    verl = dict(data_source="", solution_str="", ground_truth="", extra_info=None)
    try:
        sig.bind(**{**verl, **reward_kwargs})
        return VERL
    except TypeError as e:
        verl_error = e
    per_source = dict(solution_str="", ground_truth="")
    if "extra_info" in sig.parameters:
        per_source["extra_info"] = None
    try:
        sig.bind(**{**per_source, **reward_kwargs})
        return PER_SOURCE
    except TypeError as e:
        per_source_error = e
    raise ValueError(
        f"{fn.__name__}{sig} fits neither verl signature with reward_kwargs "
        f"{sorted(reward_kwargs)}: as compute_score(data_source, solution_str, ground_truth, "
        f"extra_info=None, **kwargs): {verl_error}; as compute_score(solution_str, ground_truth, "
        f"...): {per_source_error}")


class Scorer:
    """A reward function with its call style and reward_kwargs, or the reason it was refused."""

    def __init__(self, spec, reward_kwargs):
        self.reward_kwargs = reward_kwargs
        self.name, self.style, self.fn, self.error = "", None, None, None
        self.takes_extra_info = False
        try:
            fn = load_reward_fn(spec) if spec else default_score
            self.name = getattr(fn, "__name__", "reward_fn")
            self.style = call_style(fn, reward_kwargs)
            self.takes_extra_info = "extra_info" in inspect.signature(fn).parameters
            self.fn = fn
        except Exception as e:  # reported by /health, so keel's startup probe names it
            self.error = f"reward function {spec or 'built-in'} refused: {e}"

    def one(self, item):
        kwargs = dict(solution_str=item.get("response", ""), ground_truth=item.get("ground_truth"))
        if self.style == VERL or self.takes_extra_info:
            kwargs["extra_info"] = item.get("extra_info")
        if self.style == VERL:
            kwargs["data_source"] = item.get("data_source", "")
        out = self.fn(**{**kwargs, **self.reward_kwargs})
        if inspect.isawaitable(out):
            out = asyncio.run(out)
        if isinstance(out, dict):
            out = out.get("score")
        if not isinstance(out, numbers.Real):
            raise TypeError(f"returned {out!r}; expected a number or a dict with a number 'score'")
        reward = float(out)
        if not math.isfinite(reward):
            raise ValueError(f"returned the non-finite reward {reward}")
        return reward


class State:
    def __init__(self, scorer, flaky):
        self.scorer = scorer
        self.flaky = flaky
        self.lock = threading.Lock()
        self.requests = 0
        self.items = 0
        self.largest_batch = 0

    def score(self, items):
        rewards = []
        for i, item in enumerate(items):
            try:
                rewards.append(self.scorer.one(item))
            except Exception as e:
                raise ValueError(f"item {i} (data_source {item.get('data_source')!r}): "
                                 f"{type(e).__name__}: {e}")
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
            data = json.dumps(body, allow_nan=False).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            scorer = state.scorer
            if self.path == "/health":
                if scorer.error:
                    self.answer(503, {"ok": False, "error": scorer.error})
                else:
                    self.answer(200, {"ok": True, "reward_fn": scorer.name,
                                      "signature": scorer.style,
                                      "reward_kwargs": sorted(scorer.reward_kwargs)})
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
            if state.scorer.error:
                self.answer(503, {"error": state.scorer.error})
                return
            if state.flaky and n % state.flaky == 0:
                self.answer(503, {"error": "flaky by request (--flaky)"})
                return
            try:
                items = json.loads(raw)["items"]
                self.answer(200, {"rewards": state.score(items)})
            except Exception as e:  # the reward function's error is the caller's to see
                self.answer(400, {"error": f"{type(e).__name__}: {e}"})

    return Handler


def json_object(text):
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--port", type=int, default=8780)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--reward-fn", default="", help="path.py[:function] with a verl signature")
    p.add_argument("--reward-kwargs", type=json_object, default={},
                   help="a JSON object of keyword arguments for every call "
                        "(verl's custom_reward_function.reward_kwargs)")
    p.add_argument("--flaky", type=int, default=0, help="every Nth /score answers HTTP 503")
    args = p.parse_args()
    scorer = Scorer(args.reward_fn, args.reward_kwargs)
    if scorer.error:
        print(f"error: {scorer.error}", file=sys.stderr, flush=True)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(State(scorer, args.flaky)))
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
