"""Fault report: the longer versions of the fault tests, one table for RESULTS.md.

    python benchmarks/fault_report.py [--out DIR] [--kills 12] [--seed 0] [--server-flood 2000]

Three parts, each on the CPU with the tiny recipes of tests/test_checkpoint_faults.py:

* **training**: SFT, ORL, ORL off-policy (stale 3, save 2) and RFT, each killed (SIGKILL) at every
  point of a checkpoint write (`orl.train.checkpoint.FAULT_POINTS`) and ``--kills`` more times at
  random moments of the run, resumed each time until it ends. Counted: faults injected, runs whose
  final checkpoint (weights and DCP optimizer state) equals the uninterrupted run's bit for bit,
  silent restarts (a launch that resumed below the newest complete checkpoint on disk when it
  started), metric records lost or repeated (ORL, RFT: ``metrics.jsonl`` must hold steps 1..N once),
  temporaries left behind;
* **scoring**: `orl.eval.pool.rewards` over a slow verifier in a child process, killed at a random
  moment ``--kills`` times; counted: verifier processes that outlived their killed parent;
* **server**: `benchmarks/fuzz_server.py`'s checks (garbage bytes, slow bodies, a connection flood of
  ``--server-flood`` sockets) against a server subprocess; counted: 5xx replies, connections held
  past the deadline, RSS before / after the flood.

Prints the table and writes it to DIR/fault_report.markdown (and the raw counts to DIR/fault_report.json).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), os.path.join(HERE, "..", "tests"), os.path.join(HERE, "..", "tests", "fixtures")]

import test_checkpoint_faults as T  # noqa: E402  (the tests' tiny recipes and state comparison)

from orl.train import checkpoint as C  # noqa: E402

LAST = {"sft": 8, "orl": 4, "offpolicy": 4, "rft": 4}
KIND = {"sft": "sft", "orl": "orl", "offpolicy": "orl", "rft": "rft"}


def _cfg(recipe: str, start: str, out: str):
    if recipe == "sft":
        return T.arith_sft_smoke(out)
    if recipe == "rft":
        return T._rft(start, out)
    return T._orl(start, out, stale=3 if recipe == "offpolicy" else 1)


def _newest_step(out: str) -> int:
    complete = C.scan(out)[0] if os.path.isdir(out) else []
    return complete[-1].step if complete else 0


def _launch(recipe: str, cfg, kill_after: float | None = None, fault: str | None = None,
            resume_log: str | None = None) -> bool:
    """One launch in a forked child (resumes): True when it ran to the end, False when killed."""
    pid = os.fork()
    if pid == 0:
        try:
            if fault:
                os.environ[C.FAULT_ENV] = fault
            real = C.RunDir.load

            def load(self, model, optimizer):  # the step this launch resumes from, for the silent-restart count
                st = real(self, model, optimizer)
                with open(resume_log, "a") as f:
                    f.write(f"{self.resumed.step if self.resumed else 0}\n")
                return st
            C.RunDir.load = load
            T._train(KIND[recipe], cfg, resume=True)
            code = 0
        except BaseException as e:  # noqa: BLE001 - counted by the parent
            print(f"  launch failed: {type(e).__name__}: {e}", file=sys.stderr)
            code = 3
        os._exit(code)
    if kill_after is not None:
        t = time.monotonic()
        while time.monotonic() - t < kill_after:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
            time.sleep(0.005)
        os.kill(pid, signal.SIGKILL)
    status = os.waitpid(pid, 0)[1]
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3:
        raise RuntimeError("a launch failed (see above)")
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def training(kills: int, rng: random.Random, root: str) -> list[dict]:
    start = T._start(pathlib.Path(root))
    rows = []
    for recipe in ("sft", "orl", "offpolicy", "rft"):
        ref_out = os.path.join(root, f"ref_{recipe}")
        _launch(recipe, _cfg(recipe, start, ref_out), resume_log=os.path.join(root, "ref.log"))
        t = time.monotonic()  # a second, warm launch times a run (the first pays this process's first imports)
        _launch(recipe, _cfg(recipe, start, ref_out + "_timed"), resume_log=os.path.join(root, "ref.log"))
        wall = time.monotonic() - t
        ref = T._state(T._final_ck(ref_out, LAST[recipe]))
        row = {"recipe": recipe, "faults": 0, "runs": 0, "exact": 0, "silent_restarts": 0, "records_lost": 0,
               "records_repeated": 0, "leftovers": 0, "seconds": 0.0}
        plans = [[f"{p}@{s}"] for p in C.FAULT_POINTS for s in (2 if recipe != "sft" else 3,)]
        plans.append([None] * kills)  # one run killed ``kills`` times at random moments
        t0 = time.monotonic()
        for k, plan in enumerate(plans):
            out = os.path.join(root, f"{recipe}_{k}")
            cfg = _cfg(recipe, start, out)
            log = os.path.join(out + ".resumed")
            def silent(newest: int, seen: int) -> bool:  # this launch resumed below what was on disk
                got = [int(x) for x in open(log)] if os.path.exists(log) else []
                return len(got) > seen and got[-1] < newest  # (a launch killed before it resumed wrote nothing)

            def seen() -> int:
                return sum(1 for _ in open(log)) if os.path.exists(log) else 0
            for fault in plan:
                newest, n = _newest_step(out), seen()
                ended = _launch(recipe, cfg, kill_after=None if fault else rng.uniform(0.05 * wall, 0.95 * wall),
                                fault=fault, resume_log=log)
                row["faults"] += not ended
                row["silent_restarts"] += silent(newest, n)
                if ended:
                    break
            while True:  # resume to the end
                newest, n = _newest_step(out), seen()
                ended = _launch(recipe, cfg, resume_log=log)
                row["silent_restarts"] += silent(newest, n)
                if ended:
                    break
            row["runs"] += 1
            try:
                T._same_state(T._state(T._final_ck(out, LAST[recipe])), ref)
                row["exact"] += 1
            except AssertionError as e:
                print(f"  {recipe} plan {k}: not exact: {e}")
            if recipe != "sft":
                steps = [json.loads(x)["step"] for x in open(os.path.join(out, "metrics.jsonl"))]
                row["records_lost"] += len(set(range(1, LAST[recipe] + 1)) - set(steps))
                row["records_repeated"] += len(steps) - len(set(steps))
            row["leftovers"] += len(T._leftovers(out))
        row["seconds"] = time.monotonic() - t0
        print(f"  {recipe}: {row}", flush=True)
        rows.append(row)
    return rows


SCORER = textwrap.dedent('''
    import os, sys, time
    from orl.eval.pool import rewards
    from orl.tasks.base import Problem

    class Slow:
        name = "slow"
        def verify(self, problem, completion):
            time.sleep(0.2)
            return 1.0

    ps = [(Problem(str(i), "q", "a"), "a") for i in range(400)]
    rewards(Slow(), ps, workers=4)
''')


def _alive_in_session(pid: int) -> list[int]:
    """Live processes of ``pid``'s session (``pid`` leads it): its children, and its orphans once reparented."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != pid:
            try:
                fields = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == pid and fields[0] != "Z":  # its session (a leader), alive (zombies are dead:
                out.append(int(d))                          # a container's pid 1 may never reap them)
    return out


def scoring(kills: int, rng: random.Random, root: str) -> dict:
    path = os.path.join(root, "scorer.py")
    with open(path, "w") as f:
        f.write(SCORER)
    env = {**os.environ, "PYTHONPATH": os.path.join(HERE, "..")}
    orphans = 0
    for _ in range(kills):
        child = subprocess.Popen([sys.executable, path], start_new_session=True, env=env)
        time.sleep(rng.uniform(1.0, 3.0))  # import, start the workers, score for a while
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        time.sleep(1.0)
        left = _alive_in_session(child.pid)
        orphans += len(left)
        for p in left:
            os.kill(p, signal.SIGKILL)
    return {"kills": kills, "orphans": orphans}


def server(flood: int) -> dict | None:
    """`benchmarks/fuzz_server.py`'s summary (None when it has no `summary` entry point)."""
    import fuzz_server  # noqa: PLC0415
    if not hasattr(fuzz_server, "summary"):
        return None
    return fuzz_server.summary(flood=flood)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/fault_report")
    ap.add_argument("--kills", type=int, default=12, help="random-moment kills per recipe, and scorer kills")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-flood", type=int, default=2000, help="sockets in the connection flood")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(a.seed)
    root = tempfile.mkdtemp(prefix="fault_report.")
    try:
        t = time.time()
        train = training(a.kills, rng, root)
        score = scoring(a.kills, rng, root)
        srv = server(a.server_flood)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines = [f"`python benchmarks/fault_report.py --kills {a.kills} --seed {a.seed} --server-flood {a.server_flood}` "
             f"({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, {time.time() - t:.0f} s)", "",
             "| part | faults injected | runs | resumed exactly | silent restarts | records lost | records repeated "
             "| temporaries left | orphan processes | server 5xx |", "|" + "---|" * 10]
    for r in train:
        lines.append(f"| train {r['recipe']} | {r['faults']} | {r['runs']} | {r['exact']} | {r['silent_restarts']} | "
                     f"{r['records_lost'] if r['recipe'] != 'sft' else '-'} | "
                     f"{r['records_repeated'] if r['recipe'] != 'sft' else '-'} | {r['leftovers']} | - | - |")
    lines.append(f"| scoring (kill -9 of the scorer) | {score['kills']} | - | - | - | - | - | - | {score['orphans']} | - |")
    if srv is not None:
        lines.append(f"| server | {srv['faults']} | - | - | - | - | - | - | - | {srv['5xx']} |")
        lines.append("")
        lines.append(srv["note"])
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(a.out, "fault_report.markdown"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(a.out, "fault_report.json"), "w") as f:
        json.dump({"training": train, "scoring": score, "server": srv}, f, indent=1)


if __name__ == "__main__":
    main()
