"""Kill or interrupt `dspark-ci run` at random moments and check what it leaves.

    python bench/kill_runs.py [--kills 20] [--interrupts 20] [--seed 1]
    python bench/kill_runs.py --kills 0 --interrupts 50      # the signals only
    python bench/kill_runs.py --smoke                        # 1 interrupt (CI: the bench still runs)

Each trial runs the smoke matrix's one-node cell with the speed suite on two worker processes (a multiprocessing
manager, resource tracker and workers) and its expected rejection, as a user would (`python3 -m dspark_ci run`,
own state directory), and sends SIGKILL, or SIGINT or SIGTERM (chosen at random), at a random moment: half of the
trials anywhere in the run's usual duration, half within the second after the last cell's result was recorded
(while the final files are being written, or after). Then:

- a report.md saying PASSED or a junit.xml without failures or errors is allowed only if the exit code is 0;
- exit 130 (interrupted) comes with results.json `interrupted: true` and no `finished_at`; a results.json saying
  `interrupted` comes with exit 130 (the exit code and the files agree);
- an interrupt that exits 0 is allowed only when the run says it came after its final files were written;
- after SIGKILL and `dspark-ci cleanup --run ID` (after SIGINT/SIGTERM: at once), no process carrying the trial's
  mark, no port of its servers listening, no /dev/shm file its processes mapped, no run temp directory and no new
  /tmp/pymp-* is left.

Prints one line per trial and a summary; exits 1 if any trial broke a rule.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
ONE_NODE = "dsv4-flash-tp8-a2a-none-dspark-b7-cuda"
REJECTED = "dsv4-flash-tp8-dp4-dpattn-a2a-none-dspark-b7-cuda"
GREEN = "✅ **PASSED**"


def workers_matrix(where: Path) -> Path:
    """The smoke matrix, its speed suite on two worker processes, without baseline gates (a run that finishes is
    green, so a green file is possible at every moment: that is what is checked)."""
    matrix = yaml.safe_load((REPO / "matrices" / "smoke.yaml").read_text())
    matrix["defaults"].pop("baseline", None)
    matrix["defaults"]["suites"]["speed"] = {"num_requests": 32, "concurrency": 4, "output_len": 64, "workers": 2}
    path = where / "workers.yaml"
    path.write_text(yaml.safe_dump(matrix))
    return path


class Trial:
    def __init__(self, root: Path, matrix: Path, index: int):
        self.out, self.state = root / f"run-{index}", root / f"state-{index}"
        self.tag = uuid.uuid4().hex
        self.env = {**os.environ, "DSPARK_TEST_RUN": self.tag, "DSPARK_STATE_DIR": str(self.state),
                    "DSPARK_HISTORY": str(self.state / "history.sqlite"), "DSPARK_SIM_FAULTS": ""}
        self.argv = [sys.executable, "-m", "dspark_ci", "run", str(matrix), "--cell", ONE_NODE, "--cell", REJECTED,
                     "--suites", "speed,accept", "--out", str(self.out), "--quiet"]

    def start(self) -> subprocess.Popen:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.stderr = self.out.parent / f"{self.out.name}.stderr"
        with open(self.stderr, "w") as err:
            return subprocess.Popen(self.argv, env=self.env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)

    def results(self) -> dict:
        try:
            return json.loads((self.out / "results.json").read_text())
        except (OSError, ValueError):
            return {}

    def disagreements(self, code: int) -> list[str]:
        """Where the files and the exit code tell different stories (an interrupt is exit 130, and says so)."""
        results, problems = self.results(), []
        if code == 130 and results.get("interrupted") is not True:
            problems.append("exit 130 without interrupted: true in results.json")
        if code == 130 and results.get("finished_at"):
            problems.append("exit 130 with finished_at in results.json")
        if results.get("interrupted") and code != 130:
            problems.append(f"results.json says interrupted, exit {code}")
        return problems

    def said_finished_first(self) -> bool:
        return "the run had finished, nothing to stop" in self.stderr.read_text()

    def cells_recorded(self) -> int:
        path = self.out / "results.jsonl"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def says_passed(self) -> list[str]:
        claims = []
        report = self.out / "report.md"
        if report.exists() and GREEN in report.read_text():
            claims.append("report.md PASSED")
        junit = self.out / "junit.xml"
        if junit.exists():
            root = ET.parse(junit).getroot()
            if int(root.get("tests", 0)) and not int(root.get("failures", 0)) and not int(root.get("errors", 0)):
                claims.append("junit.xml green")
        return claims

    def run_id(self) -> str | None:
        try:
            return json.loads((self.out / "results.json").read_text())["run_id"]
        except (OSError, ValueError, KeyError):
            return None

    def ports(self) -> list[int]:
        ports = []
        for log in self.out.glob("logs/*/0.log"):
            words = log.read_text().splitlines()[0].split()
            if "--port" in words:
                ports.append(int(words[words.index("--port") + 1]))
        return ports


def marked_processes(tag: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.environ().get("DSPARK_TEST_RUN") == tag:
                found.append(" ".join(proc.cmdline())[:100])
        except psutil.Error:
            continue
    return found


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class SharedMemoryWatch:
    """The /dev/shm files the trial's own processes map, sampled while it runs (other runs on a shared machine
    make their own, which are not this trial's to account for)."""

    def __init__(self, tag: str):
        self.tag, self.seen = tag, set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.3):
            for proc in psutil.process_iter():
                try:
                    if proc.environ().get("DSPARK_TEST_RUN") == self.tag:
                        self.seen |= {Path(m.path.removesuffix(" (deleted)")).name
                                      for m in proc.memory_maps() if m.path.startswith("/dev/shm/")}
                except psutil.Error:
                    continue

    def stop(self) -> set[str]:
        self._done.set()
        self._thread.join()
        return self.seen


def leftovers(trial: Trial, shm_ours: set[str], pymp_before: set[str]) -> list[str]:
    deadline = time.monotonic() + 5
    while marked_processes(trial.tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [f"process {p}" for p in marked_processes(trial.tag)]
    left += [f"port {p}" for p in trial.ports() if listening(p)]
    left += [f"/dev/shm/{name}" for name in shm_ours & set(os.listdir("/dev/shm"))]
    run_id = trial.run_id()
    temp = Path(tempfile.gettempdir())
    if run_id and (temp / f"dspark-ci-{run_id}").exists():
        left.append(f"temp directory dspark-ci-{run_id}")
    left += [f"/tmp/{name}" for name in {p.name for p in temp.glob("pymp-*")} - pymp_before]
    return left


def one_trial(trial: Trial, sig: int, after_last_cell: bool, usual_s: float, rng: random.Random) -> dict:
    pymp_before = {p.name for p in Path(tempfile.gettempdir()).glob("pymp-*")}
    process = trial.start()
    shm = SharedMemoryWatch(trial.tag)
    started = time.monotonic()
    if after_last_cell:
        while trial.cells_recorded() < 2 and process.poll() is None and time.monotonic() - started < 300:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 1.0))  # the final files take a moment (report.html draws charts)
    else:
        time.sleep(rng.uniform(0.5, usual_s * 1.05))
    when = time.monotonic() - started
    exited_before = process.poll() is not None
    if not exited_before:
        process.send_signal(sig)
    try:
        code = process.wait(timeout=900)  # teardown and the final files on a loaded machine take minutes
    except subprocess.TimeoutExpired:
        process.kill()
        code = process.wait()
    shm_ours = shm.stop()
    claims = trial.says_passed()
    cleaned = None
    if sig == signal.SIGKILL and trial.run_id():
        cleaned = subprocess.run([sys.executable, "-m", "dspark_ci", "cleanup", "--run", trial.run_id()],
                                 env=trial.env, cwd=REPO, capture_output=True, text=True, timeout=120)
    problems = [f"{claim} with exit {code}" for claim in claims if code != 0]
    if sig != signal.SIGKILL:
        problems += trial.disagreements(code)
        if code == 0 and not exited_before and not trial.said_finished_first():
            problems.append(f"{signal.Signals(sig).name} lost: exit 0")
    if cleaned is not None and cleaned.returncode not in (0, 2):  # 2: the run had finished and cleaned itself
        problems.append(f"cleanup exit {cleaned.returncode}: {cleaned.stderr.strip()[:200]}")
    problems += [f"left: {what}" for what in leftovers(trial, shm_ours, pymp_before)]
    return {"signal": signal.Signals(sig).name, "after_last_cell": after_last_cell, "at_s": round(when, 2),
            "exit": code, "interrupted": trial.results().get("interrupted", False),
            "came_after_finish": code == 0 and not exited_before and trial.said_finished_first(), "exited_before_signal": exited_before, "cells_recorded": trial.cells_recorded(),
            "shm_seen": len(shm_ours), "claims": claims, "problems": problems}


def summary(results: list[dict], broken: int) -> str:
    interrupts = [r for r in results if r["signal"] != "SIGKILL"]
    exit_0 = [r for r in interrupts if r["exit"] == 0 and not r["exited_before_signal"]]
    exit_130 = [r for r in interrupts if r["exit"] == 130]
    disagree = [r for r in interrupts if any("exit" in p and "results.json" in p or "with exit" in p
                                             for p in r["problems"])]
    by_signal = {name: sum(r["signal"] == name for r in interrupts) for name in ("SIGINT", "SIGTERM")}
    return (f"{len(results)} trials ({len(results) - len(interrupts)} SIGKILL, {by_signal['SIGINT']} SIGINT, "
            f"{by_signal['SIGTERM']} SIGTERM, half of each within 1 s after the last cell): {broken} broke a rule; "
            f"interrupts: {len(exit_130)} exit 130 ({sum(r['interrupted'] is True for r in exit_130)} with "
            f"interrupted: true), {len(exit_0)} exit 0 ({sum(r['came_after_finish'] for r in exit_0)} after the final "
            f"files, said so), {len(disagree)} with files disagreeing with the exit code")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--interrupts", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="one interrupt after the calibration run (CI's check "
                        "that the bench still runs)")
    args = parser.parse_args()
    if args.smoke:
        args.kills, args.interrupts = 0, 1
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="kill-runs-") as tmp:
        root = Path(tmp)
        matrix = workers_matrix(root)
        calibration = Trial(root, matrix, 0)
        began = time.monotonic()
        code = calibration.start().wait(timeout=600)
        usual_s = time.monotonic() - began
        print(f"calibration run: exit {code} in {usual_s:.1f} s", flush=True)
        plan = [(signal.SIGKILL, i % 2 == 1) for i in range(args.kills)]
        plan += [(rng.choice((signal.SIGINT, signal.SIGTERM)), i % 2 == 1) for i in range(args.interrupts)]
        rng.shuffle(plan)
        broken, results = 0, []
        for index, (sig, late) in enumerate(plan, 1):
            result = one_trial(Trial(root, matrix, index), sig, late, usual_s, rng)
            broken += bool(result["problems"])
            results.append(result)
            print(json.dumps(result), flush=True)
        print(summary(results, broken), flush=True)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
