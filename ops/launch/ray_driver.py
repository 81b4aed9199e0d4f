#!/usr/bin/env python3
"""keel on Ray: the driver that `keel launch ray` renders (re-render it rather than edit it).

Ray has no Rust API, so each keel role runs as a subprocess of a Ray actor (the pattern verl and
OpenRLHF use for inference servers):

- one placement group with a bundle per role (CPUs, GPUs), one actor per bundle;
- the actor's constructor starts the process (`keel trainer ...` or `keel generator --rank R
  ...`), so a restarted actor is a restarted process; the child gets SIGTERM if the actor's
  process dies for any reason (PR_SET_PDEATHSIG);
- SIGTERM/SIGINT sent to an actor's process (its node is going away) are forwarded to the
  child; once the child has exited (the trainer commits a checkpoint within the grace) the
  actor ends, and Ray restarts it where there is room: the role resumes from the run root;
- a generator whose process exits non-zero takes its actor down, and Ray restarts the actor
  (`max_restarts`) and retries the pending `wait` on it (`max_task_retries`); the trainer's
  actor does the same only when its process was killed by a signal (OOM killer, SIGKILL: it
  resumes from the run root), since an exit code is keel's own verdict;
- the driver waits for the trainer and exits with its exit code; the generators, which exit 0
  once the trainer has finished the run, are then given the grace to do so and stopped (at
  once after a failure or a stop);
- SIGTERM/SIGINT to the driver are forwarded to every role (the trainer commits a checkpoint
  within the grace); a second one stops waiting.

The grace (`engine_grace_s`) is the config's run.sigterm_grace_s plus a margin, so keel's own
deadline comes first.

The processes coordinate only through the run root. Everything specific to this launch is in
PLAN, one JSON document that `keel launch ray` wrote below as a string literal.
"""

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

PLAN = json.loads(@KEEL_PLAN@)

PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """A preexec_fn for the child: SIGTERM when the actor's process dies (Linux), or None.

    prctl is looked up here, before the fork: the child of a threaded process must not load
    anything between fork and exec."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong]
    parent = os.getpid()
    sigterm = int(signal.SIGTERM)

    def in_child():
        prctl(PR_SET_PDEATHSIG, sigterm)
        if os.getppid() != parent:  # the actor died before prctl took effect
            os.kill(os.getpid(), sigterm)

    return in_child


def _shell_code(returncode):
    """A child's status as a shell reports it: 128 + N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _log(msg):
    print(f"keel launch ray: {msg}", file=sys.stderr, flush=True)


@ray.remote(
    max_restarts=PLAN["max_restarts"],
    max_task_retries=-1,
    max_concurrency=4,
)
class KeelProcess:
    """One keel process. The constructor runs on the actor's main thread (where signal handlers
    can be set, and whose death PDEATHSIG watches); `wait`, `stop` and `kill` run on its other
    threads."""

    def __init__(self, role):
        self.role = role
        self.stopping = False  # the driver asked: the child's exit is final
        self.moving = False  # the actor's process got a signal: exit and be restarted
        self.tmp = None
        argv = list(role["argv"])
        if role.get("config_text") is not None:
            # The config travels in the plan: the trainer's node needs no copy of the file.
            self.tmp = tempfile.mkdtemp(prefix="keel-launch-")
            path = os.path.join(self.tmp, "config.toml")
            with open(path, "w", encoding="utf-8") as f:
                f.write(role["config_text"])
            argv[2:2] = ["--config", path]
        cwd = PLAN["cwd"] if os.path.isdir(PLAN["cwd"]) else None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._forward)
        self.child = subprocess.Popen(
            argv, cwd=cwd, preexec_fn=_die_with_parent(), start_new_session=True
        )

    def __repr__(self):
        # Ray prefixes the lines this actor (and its child) print with this.
        return f"keel-{self.role['name']}"

    def _forward(self, signum, _frame):
        # After the driver's own stop the child's exit is final; otherwise move on.
        self.moving = not self.stopping
        if self.child.poll() is None:
            self.child.send_signal(signum)
        try:
            self.child.wait(timeout=PLAN["engine_grace_s"])
        except subprocess.TimeoutExpired:
            self.child.kill()
        if self.moving:
            os._exit(1)

    def wait(self):
        """The child's exit code, once it exits. A failure that the role restarts on ends this
        actor instead (Ray restarts it, which starts a new child, and retries this call)."""
        code = self.child.wait()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        while self.moving:
            time.sleep(1)  # the signal handler ends the process
        restart = self.role["restart_on"]
        failed = (code != 0 and restart == "failure") or (code < 0 and restart == "signal")
        if failed and not self.stopping:
            print(
                f"keel-{self.role['name']}: process exited with {_shell_code(code)}; "
                "restarting it",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)
        return _shell_code(code)

    def stop(self):
        """SIGTERM to the child; it is not restarted after this."""
        self.stopping = True
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)
        return True

    def kill(self):
        """SIGKILL to the child (after a stop that did not end it)."""
        self.stopping = True
        if self.child.poll() is None:
            self.child.kill()
        return True


STOP_REQUESTS = []


def _on_signal(signum, _frame):
    STOP_REQUESTS.append(signum)


def _drain(refs, deadline):
    """Waits for refs until the deadline; returns those still pending."""
    pending = list(refs)
    while pending and time.monotonic() < deadline:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
    return pending


def _result(ref):
    """A role's exit code, or None when its actor is gone for good."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayError as e:
        _log(f"{type(e).__name__}: {e}")
        return None


def main():
    ray.init(address=PLAN["address"])
    # After ray.init, which sets a SIGTERM handler of its own (exit at once).
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    roles = PLAN["roles"]
    _log(f"run root {PLAN['run_root']}: the trainer and {len(roles) - 1} generator(s)")
    bundles = []
    for role in roles:
        bundle = {"CPU": role["cpus"], "GPU": role["gpus"]}
        bundles.append({k: v for k, v in bundle.items() if v > 0})
    pg = placement_group(bundles, strategy=PLAN["placement_strategy"])
    deadline = time.monotonic() + PLAN["placement_timeout_s"]
    while not ray.wait([pg.ready()], timeout=1.0)[0]:
        if STOP_REQUESTS or time.monotonic() > deadline:
            if not STOP_REQUESTS:
                _log(
                    f"the placement group {bundles} was not ready after "
                    f"{PLAN['placement_timeout_s']} s: the cluster lacks the resources "
                    "(see `ray status`)"
                )
            remove_placement_group(pg)
            return 1
    actors = [
        KeelProcess.options(
            num_cpus=role["cpus"],
            num_gpus=role["gpus"],
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=index
            ),
        ).remote(role)
        for index, role in enumerate(roles)
    ]
    refs = [actor.wait.remote() for actor in actors]
    trainer_ref = refs[0]
    grace = PLAN["engine_grace_s"]
    code = None
    gone = []
    stop_deadline = None
    abort = False
    pending = list(refs)

    def stop_all(why):
        nonlocal stop_deadline
        if stop_deadline is None:
            _log(f"{why}: SIGTERM to every role")
            for actor in actors:
                actor.stop.remote()
            stop_deadline = time.monotonic() + grace + 10

    while code is None:
        if STOP_REQUESTS:
            stop_all("stop requested")
        if len(STOP_REQUESTS) > 1 or (
            stop_deadline is not None and time.monotonic() > stop_deadline
        ):
            _log("not waiting any longer for the trainer to stop")
            code, abort = 1, True
            break
        done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
        for ref in done:
            name = roles[refs.index(ref)]["name"]
            result = _result(ref)
            if ref == trainer_ref:
                code = 1 if result is None else result
                _log(f"trainer exited with {code}")
            elif result is None:
                # A rank gone for good leaves the trainer waiting: stop the run (the trainer
                # commits a checkpoint) and report the failure.
                gone.append(name)
                stop_all(f"{name} is gone for good")
            elif result != 0:
                _log(f"{name} exited with {result}")
    if gone and code == 0:
        _log(f"failing the launch: {', '.join(gone)} gone for good")
        code = 1
    # The generators exit 0 once the trainer has finished the run; after a failure or a stop
    # they are told at once.
    pending = [r for r in pending if r != trainer_ref]
    if not abort:
        if code == 0 and stop_deadline is None:
            pending = _drain(pending, time.monotonic() + grace)
        if pending:
            stop_all(f"{len(pending)} generator(s) still running")
            pending = _drain(pending, time.monotonic() + grace)
    for actor in actors:
        try:
            ray.get(actor.kill.remote(), timeout=10)
        except ray.exceptions.RayError:
            pass
        ray.kill(actor, no_restart=True)
    remove_placement_group(pg)
    return code


if __name__ == "__main__":
    sys.exit(main())
