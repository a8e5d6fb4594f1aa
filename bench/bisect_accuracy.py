"""How often bisect names the planted culprit, in how many steps, beside a one-run-per-step bisect.

Fast path (default): the real search (``dspark_ci.bisection.bisect``: the gates' sequential verdict per step, the
A/B confirmation, infrastructure retries) against a simulated measurement: 64 versions, a regression planted at
one of them (uniform over 1..63, per seed), each run's median TPOT drawn with the noise model below, and some
runs failing for infrastructure reasons. Beside it, the naive bisect community tools run: one run per build,
each step following the nearer end. Both see the same noise.

End-to-end path (``--e2e N``): ``dspark-ci bisect`` itself, N times, over the simulated SGLang server with
``DSPARK_SIM_REGRESSION`` planted at a random one of ``--e2e-versions`` versions (real launches, real suites).

    python bench/bisect_accuracy.py                      # 3 repeats x 100 seeds, min/median/max
    python bench/bisect_accuracy.py --e2e 3 --e2e-versions 8
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dspark_ci.ground import stats  # noqa: E402

from dspark_ci.bisection import FOUND, Chase, Sample, bisect  # noqa: E402

VERSIONS = 64
BASE_TPOT_MS = 20.0
REGRESSION = 0.05  # +5 % TPOT from the planted version on
RUN_NOISE = 0.02  # run-to-run (per boot) noise, lognormal σ: STATISTICS.md's simulated 2 %
INFRA_RATE = 0.03  # share of runs lost to the machine (launch timeout, node lost)


def versions(count: int) -> list[str]:
    return [f"0.6.{i}" for i in range(count)]


def simulated(builds: list[str], planted: int, rng: random.Random):
    position = {ref: i for i, ref in enumerate(builds)}

    def measure(ref: str) -> Sample:
        if rng.random() < INFRA_RATE:
            return Sample(None, infrastructure=True, note="launch timeout")
        level = BASE_TPOT_MS * (1 + REGRESSION * (position[ref] >= planted))
        return Sample(level * math.exp(rng.gauss(0.0, RUN_NOISE)))
    return measure


def naive_bisect(builds: list[str], measure) -> tuple[str, int]:
    """One run per build: both ends once, each midpoint once, following the nearer end (infrastructure failures
    re-run, as any tool would)."""
    def once(ref: str) -> float:
        while True:
            got = measure(ref)
            if not got.infrastructure:
                return got.value
    good_value, bad_value = once(builds[0]), once(builds[-1])
    good, bad, steps = 0, len(builds) - 1, 0
    while bad - good > 1:
        mid = (good + bad) // 2
        value, steps = once(builds[mid]), steps + 1
        if abs(value - bad_value) < abs(value - good_value):
            bad = mid
        else:
            good = mid
    return builds[bad], steps


def fast(seeds: range) -> dict:
    builds = versions(VERSIONS)
    chase = Chase("tpot_ms_median", stats.LOWER)
    right = naive_right = steps = naive_steps = runs = confirmed = 0
    for seed in seeds:
        planted = random.Random(f"plant-{seed}").randrange(1, VERSIONS)
        outcome = bisect(builds, chase, simulated(builds, planted, random.Random(seed)))
        right += outcome.outcome == FOUND and outcome.culprit == builds[planted]
        confirmed += outcome.confirmed
        steps += len(outcome.steps)
        runs += outcome.runs
        culprit, taken = naive_bisect(builds, simulated(builds, planted, random.Random(seed)))
        naive_right += culprit == builds[planted]
        naive_steps += taken
    n = len(seeds)
    return {"right": right, "confirmed": confirmed, "mean_steps": steps / n, "mean_runs": runs / n,
            "naive_right": naive_right, "naive_mean_steps": naive_steps / n, "seeds": n}


def e2e(trials: int, count: int, workdir: Path) -> list[dict]:
    """dspark-ci bisect over the simulator, the regression planted at a random version each time."""
    builds = versions(count)
    results = []
    for trial in range(trials):
        planted = random.Random(f"e2e-{trial}").randrange(1, count)
        out = workdir / f"trial-{trial}"
        env = {**os.environ, "DSPARK_SIM_REGRESSION": f"{builds[planted]}:slow_decode=1.10",
               "DSPARK_SIM_STEP_JITTER_BOOT": str(RUN_NOISE),  # the simulator's noise model: per-boot TPOT noise
               "DSPARK_STATE_DIR": str(workdir / "state"), "DSPARK_HISTORY": str(workdir / "history.sqlite")}
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "dspark_ci", "bisect", "matrices/smoke.yaml",
                               "--cell", "dsv4-flash-tp8-a2a-none-dspark-b7-cuda", "--metric", "tpot_ms_median",
                               "--builds", ",".join(builds), "--suites", "speed", "--out", str(out)],
                              capture_output=True, text=True, env=env, cwd=REPO)
        report = json.loads((out / "bisect.json").read_text()) if (out / "bisect.json").is_file() else {}
        results.append({"planted": builds[planted], "culprit": report.get("culprit"), "exit": done.returncode,
                        "steps": len(report.get("steps", [])), "runs": report.get("runs"),
                        "confidence": report.get("confidence"), "seconds": round(time.monotonic() - started, 1)})
        print(json.dumps(results[-1]), flush=True)
    return results


def spread(values: list[float]) -> str:
    return f"{min(values):g} / {statistics.median(values):g} / {max(values):g}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--e2e", type=int, default=0, metavar="N", help="also N end-to-end bisects on the simulator")
    parser.add_argument("--e2e-versions", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="CI's check that the bench still runs: 5 seeds, once")
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.repeats, args.e2e = 5, 1, 0
    rows = []
    for repeat in range(args.repeats):
        started = time.monotonic()
        row = fast(range(repeat * args.seeds, (repeat + 1) * args.seeds))
        row["seconds"] = round(time.monotonic() - started, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\nfast path, {VERSIONS} versions, +{REGRESSION:.0%} TPOT planted, {RUN_NOISE:.0%} run noise, "
          f"{INFRA_RATE:.0%} infrastructure failures; min / median / max over {args.repeats} repeats of "
          f"{args.seeds} seeds:")
    for key, what in (("right", "sequential: culprit named (of seeds)"), ("confirmed", "sequential: A/B confirmed"),
                      ("mean_steps", "sequential: steps per bisect (mean)"),
                      ("mean_runs", "sequential: runs per bisect (mean)"),
                      ("naive_right", "one run per step: culprit named"),
                      ("naive_mean_steps", "one run per step: steps (mean)"), ("seconds", "wall seconds")):
        print(f"  {what:45s} {spread([row[key] for row in rows])}")
    if args.e2e:
        with tempfile.TemporaryDirectory(prefix="bisect-e2e-") as workdir:
            trials = e2e(args.e2e, args.e2e_versions, Path(workdir))
        right = sum(t["culprit"] == t["planted"] for t in trials)
        print(f"\nend to end ({args.e2e_versions} versions, simulator, slow_decode=1.10 planted, "
              f"DSPARK_SIM_STEP_JITTER_BOOT={RUN_NOISE}): {right} of "
              f"{len(trials)} named; steps {spread([t['steps'] for t in trials])}; runs "
              f"{spread([t['runs'] or 0 for t in trials])}; seconds {spread([t['seconds'] for t in trials])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
