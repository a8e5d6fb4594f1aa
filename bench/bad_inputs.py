"""How long `dspark-ci run` takes to refuse each bad input (the goal: exit 2 within 5 s, nothing launched).

    python bench/bad_inputs.py [--repeats 3]

Each input is run as a user runs it (`python -m dspark_ci run INPUT --out DIR`, a fresh DIR) and timed from start to
exit, wall clock, including the interpreter's start-up; prints min/median/max seconds, the exit code and the message.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAD = "hardware: {cuda: h200}\ndefaults:\n  model: m\n  tp: 1\n  gpus_per_node: 1\n"
BOMB = ("laughs:\n  - &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
        + "".join(f"  - &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9))
        + HEAD + "  suites:\n    gpqa: {chat_template_kwargs: {k: *l8}}\ninclude: [{}]\n")


def inputs(work: Path) -> dict[str, str]:
    """name -> matrix path (written into ``work``)."""
    def write(name: str, text: str | bytes) -> str:
        path = work / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return str(path)

    os.mkfifo(work / "fifo.yaml")
    return {
        "/dev/zero": "/dev/zero",
        "a FIFO": str(work / "fifo.yaml"),
        "a 50 MB matrix": write("big.yaml", HEAD.encode() + b"#" * (50 * 2**20)),
        "a NUL byte": write("nul.yaml", HEAD + "description: a\x00b\ninclude: [{}]\n"),
        "an alias bomb under gpqa.chat_template_kwargs": write("bomb.yaml", BOMB),
        "speed.num_requests: 1000000000": write("count.yaml",
                                                HEAD + "  suites:\n    speed: {num_requests: 1000000000}\n"
                                                "include: [{}]\n"),
        "tp = gpus_per_node = 2**64": write("huge.yaml", HEAD.replace("tp: 1", f"tp: {2**64}")
                                            .replace("gpus_per_node: 1",
                                                     f"gpus_per_node: {2**64}") + "include: [{}]\n"),
        "90,000 nested [ (200 KB)": write("deep.yaml", HEAD + "x: " + "[" * 90000 + "]" * 90000 + "\ninclude: [{}]\n"),
        "2,000 nested [ in accept.num_requests": write("deep-accept.yaml", HEAD + "  suites:\n    accept: "
                                                     "{num_requests: " + "[" * 2000 + "1" + "]" * 2000 + "}\n"
                                                     "include: [{}]\n"),
        "a 5001-digit integer": write("digits.yaml", HEAD.replace("tp: 1", "tp: " + "9" * 5001) + "include: [{}]\n"),
        "a 5000-character model_slug": write("slug.yaml", HEAD + "  model_slug: " + "m" * 5000 + "\ninclude: [{}]\n"),
        "a NUL byte in an env value": write("env-nul.yaml",
                                            HEAD + '  env: {DSPARK_SIM_SEED: "1\\0 2"}\ninclude: [{}]\n'),
        "slow_decode=inf": write("inf.yaml", HEAD + '  env: {DSPARK_SIM_FAULTS: "slow_decode=inf"}\ninclude: [{}]\n'),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one repeat of each input")
    args = parser.parse_args()
    args.repeats = 1 if args.smoke else args.repeats
    print("| input | exit | seconds min / median / max | message |\n|---|---|---|---|")
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="bad-inputs-") as tmp:
        for name, path in inputs(Path(tmp)).items():
            times, codes, message = [], set(), ""
            for repeat in range(args.repeats):
                started = time.monotonic()
                done = subprocess.run([sys.executable, "-m", "dspark_ci", "run", path, "--out",
                                       str(Path(tmp) / f"out-{repeat}")], cwd=REPO, capture_output=True, text=True,
                                      timeout=600)
                times.append(time.monotonic() - started)
                codes.add(done.returncode)
                message = done.stderr.strip().splitlines()[-1][:110]
            worst = max(worst, max(times))
            print(f"| {name} | {','.join(map(str, sorted(codes)))} | {min(times):.2f} / {statistics.median(times):.2f} "
                  f"/ {max(times):.2f} | `{message}` |")
    print(f"\nslowest refusal: {worst:.2f} s")
    return 0 if worst < 5 else 1


if __name__ == "__main__":
    sys.exit(main())
