#!/usr/bin/env python3
"""A stand-in for the `keel` binary in the launcher tests: `trainer` and `generator` record
what they were given and follow the contract of the real roles, under the test's control.

Everything goes through `<run root>/fake/` (the engines give their processes no environment of
the test's):
- every process writes `<role>-<pid>.json`: its argv, its working directory and the text of
  its --config file, if it has one;
- `trainer` runs until `finish` exists and exits with the number in it (then `done` exists);
  on SIGTERM it writes `trainer-sigterm` and exits 0 (a checkpoint, then exit 0);
- `generator --rank R` runs until `done` exists and exits 0; it exits 7 at once if
  `fail-once-R` exists (removing it); on SIGTERM it writes `generator-R-sigterm` and exits 0.
"""

import json
import os
import signal
import sys
import time


def arg(argv, flag):
    return argv[argv.index(flag) + 1]


def main():
    argv = sys.argv[1:]
    role = argv[0]
    fake = os.path.join(arg(argv, "--run-root"), "fake")
    os.makedirs(fake, exist_ok=True)
    name = role if role == "trainer" else f"generator-{arg(argv, '--rank')}"
    record = {"argv": sys.argv, "cwd": os.getcwd()}
    if "--config" in argv:
        with open(arg(argv, "--config"), encoding="utf-8") as f:
            record["config_text"] = f.read()
    with open(os.path.join(fake, f"{name}-{os.getpid()}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f)

    def on_term(_signum, _frame):
        open(os.path.join(fake, f"{name}-sigterm"), "w").close()
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    if role == "trainer":
        finish = os.path.join(fake, "finish")
        while not os.path.exists(finish):
            time.sleep(0.1)
        time.sleep(0.1)
        with open(finish, encoding="utf-8") as f:
            code = int(f.read().strip() or "0")
        open(os.path.join(fake, "done"), "w").close()
        sys.exit(code)
    fail_once = os.path.join(fake, f"fail-once-{arg(argv, '--rank')}")
    if os.path.exists(fail_once):
        os.remove(fail_once)
        sys.exit(7)
    while not os.path.exists(os.path.join(fake, "done")):
        time.sleep(0.1)
    sys.exit(0)


if __name__ == "__main__":
    main()
