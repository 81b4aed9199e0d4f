#!/usr/bin/env python3
"""Reference server of keel's HTTP+JSON env protocol (see PROTOCOL.md beside this file).

Serves a toy task, `guess`: find a secret number in 1..64 with `guess N`; the env answers
`higher` or `lower`; reward 1 for finding it within 7 turns (binary search always does).
Standard library only. Run:

    python3 reference_server.py --port 8770          # 0 picks a free port
    python3 reference_server.py --port 0 --flaky 3  # every 3rd request fails with HTTP 503

The first line printed to stdout is `listening on PORT`.
"""

import argparse
import json
import random
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME = "guess"
TOP = 64
MAX_TURNS = 7
INVALID = "error invalid action"
VOCABULARY = ["task", "guess", "a", "number", "between", "and", "higher", "lower",
              "error", "invalid", "action"] + [str(n) for n in range(1, TOP + 1)]


class Guess:
    """One episode of the toy task; its whole state is JSON-serialisable."""

    def __init__(self, state=None):
        self.state = state or {"secret": 1, "lo": 1, "hi": TOP, "turns": 0,
                               "done": True, "success": False}

    def reset(self, seed):
        secret = random.Random(seed).randint(1, TOP)
        self.state = {"secret": secret, "lo": 1, "hi": TOP, "turns": 0,
                      "done": False, "success": False}
        return f"task guess a number between 1 and {TOP}"

    def step(self, action):
        s = self.state
        if s["done"]:
            return {"observation": INVALID, "reward": 0.0, "done": True, "invalid_action": True}
        s["turns"] += 1
        words = action.split()
        n = None
        if len(words) == 2 and words[0] == "guess" and words[1].isdigit() and words[1] == str(int(words[1])):
            n = int(words[1])
            if not 1 <= n <= TOP:
                n = None
        reward, invalid, obs = 0.0, n is None, INVALID
        if n is not None:
            if n == s["secret"]:
                s["done"], s["success"], reward, obs = True, True, 1.0, ""
            elif n < s["secret"]:
                s["lo"], obs = max(s["lo"], n + 1), "higher"
            else:
                s["hi"], obs = min(s["hi"], n - 1), "lower"
        if s["turns"] >= MAX_TURNS:
            s["done"] = True
        return {"observation": obs, "reward": reward, "done": s["done"], "invalid_action": invalid}

    def view(self):
        s = self.state
        lo, hi = s["lo"], s["hi"]
        return {
            "agent_id": 0,
            "anchor_state": f"lo {lo} hi {hi} done {s['done']}",
            "admissible_actions": [] if s["done"] else [f"guess {k}" for k in range(lo, hi + 1)],
            "oracle_action": f"guess {(lo + hi) // 2}",
            "success": s["success"],
            "turns": s["turns"],
            "done": s["done"],
        }


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, flaky, fail_resets=False, auth_token="", info_max_turns=None,
                 hang_steps_after=0):
        super().__init__(addr, Handler)
        self.hang_steps_after = hang_steps_after
        self.steps = 0
        self.auth_token = auth_token
        self.info_max_turns = MAX_TURNS if info_max_turns is None else info_max_turns
        self.sessions = {}  # id -> (Guess, last_turn, last_answer)
        self.lock = threading.Lock()
        self.flaky = flaky
        self.fail_resets = fail_resets
        self.requests = 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms stalls

    def log_message(self, *args):  # quiet
        pass

    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def refused(self):
        """With --auth-token, a request without `Authorization: Bearer <token>` gets 401."""
        token = self.server.auth_token
        if token and self.headers.get("Authorization") != f"Bearer {token}":
            self.reply(401, {"error": "missing or wrong bearer token"})
            return True
        return False

    def flaked(self):
        srv = self.server
        with srv.lock:
            srv.requests += 1
            fail = srv.flaky > 0 and srv.requests % srv.flaky == 0
        if fail:
            self.reply(503, {"error": "injected failure (--flaky)"})
        return fail

    def do_GET(self):
        if self.refused() or self.flaked():
            return
        if self.path == "/info":
            self.reply(200, {"name": NAME, "max_turns": self.server.info_max_turns, "vocabulary": VOCABULARY})
        else:
            self.reply(404, {"error": f"unknown path {self.path}"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self.reply(400, {"error": "body is not JSON"})
        if self.refused() or self.flaked():
            return
        srv = self.server
        sid = body.get("session")
        with srv.lock:
            if self.path == "/reset" and srv.fail_resets:
                return self.reply(500, {"error": "injected failure (--fail-resets)"})
            if self.path == "/reset":
                sid = sid if sid in srv.sessions else uuid.uuid4().hex
                env = Guess()
                prompt = env.reset(int(body.get("seed", 0)))
                srv.sessions[sid] = [env, 0, None]
                return self.reply(200, {"session": sid, "prompt": prompt, "view": env.view()})
            if self.path == "/restore":
                sid = sid if sid in srv.sessions else uuid.uuid4().hex
                env = Guess(dict(body["state"]))
                srv.sessions[sid] = [env, env.state["turns"], None]
                return self.reply(200, {"session": sid, "view": env.view()})
            if sid not in srv.sessions:
                return self.reply(404, {"error": f"unknown session {sid!r}"})
            entry = srv.sessions[sid]
            env = entry[0]
            hang = False
            if self.path == "/step" and srv.hang_steps_after > 0:
                srv.steps += 1
                hang = srv.steps > srv.hang_steps_after
            if not hang and self.path == "/step":
                turn = int(body.get("turn", 0))
                if turn == entry[1] and entry[2] is not None:  # a retried step: same answer
                    return self.reply(200, entry[2])
                if turn != entry[1] + 1:
                    return self.reply(409, {"error": f"turn {turn} but the episode is at {entry[1]}"})
                answer = {"outcome": env.step(str(body.get("action", ""))), "view": env.view()}
                entry[1], entry[2] = turn, answer
                return self.reply(200, answer)
            if self.path == "/snapshot":
                return self.reply(200, {"state": json.loads(json.dumps(env.state))})
            if self.path == "/close":
                del srv.sessions[sid]
                return self.reply(200, {})
        if hang:  # --hang-steps-after: the tool call that never returns
            time.sleep(3600)
            return
        self.reply(404, {"error": f"unknown path {self.path}"})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8770)
    parser.add_argument("--flaky", type=int, default=0, help="fail every Nth request with 503")
    parser.add_argument("--fail-resets", action="store_true", help="answer every /reset with 500")
    parser.add_argument("--auth-token", default="", help="require `Authorization: Bearer TOKEN`")
    parser.add_argument("--info-max-turns", type=int, default=None, help="max_turns /info reports (tests of bad /info answers)")
    parser.add_argument("--hang-steps-after", type=int, default=0, help="after N /step requests, never answer another")
    args = parser.parse_args()
    server = Server((args.host, args.port), args.flaky, args.fail_resets, args.auth_token,
                    args.info_max_turns, args.hang_steps_after)
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
