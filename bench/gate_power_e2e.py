"""Gate power end to end on the simulator (``gate_power.py --e2e N``): `dspark-ci run` itself, not the arithmetic.

Each scenario runs N times with the benchmark's noise model switched on as the simulator's knobs (``E2E_NOISE``):
the smoke matrix against the shipped ``baselines/smoke.yaml`` (clean with every suite, accept length −5 %, TPOT
+5 %), and a GPQA-Diamond-sized cell (198 questions × 8 repeats, answers drawn per sample around per-question
probabilities, concentration 0.5 as in ``gate_power.GPQA_CONCENTRATION``) against a baseline recorded here with
`dspark-ci baseline record` from ``--e2e-baseline-runs`` clean runs, as a user records a nightly's: clean and with a
5-point drop. Printed per scenario: the runs' exit codes, how many were red (exit 1), every gate's verdicts over
every cell, and the boots spent per measured cell.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dspark_ci.suites.data.make_gpqa_synthetic import main as make_gpqa  # noqa: E402

from bench.gate_power import SPEED_BOOT  # noqa: E402

# The benchmark's noise model as the simulator's knobs (sglang_sim/sim_config.py): per-boot decode-step jitter (the
# speed metrics' run-to-run part), per-request jitter on top, and a per-boot shift of the accept probability α of
# 0.003, which moves the smoke matrix's accept length by 0.8 % (dL/dα ≈ 8.1 at α = 0.7, L ≈ 3.1). The smoke
# cells' GPQA keeps its fixed answers: the shipped smoke baseline's per-question record is of fixed answers on 20
# questions; the 198-question cell draws its answers per sample (GPQA_CELL_ENV).
E2E_NOISE = {"DSPARK_SIM_STEP_JITTER_BOOT": f"{SPEED_BOOT:g}", "DSPARK_SIM_STEP_JITTER_REQUEST": "0.05",
             "DSPARK_SIM_ACCEPT_DRIFT_BOOT": "0.003"}
GPQA_QUESTIONS, GPQA_REPEATS = 198, 8
# A 5 ms decode step and 128 requests at once: GPQA's timing is not what this cell measures, and 1,584 answers
# per boot at the smoke matrix's 20 ms and 64 at once took 100 s.
GPQA_CELL_ENV = {"DSPARK_SIM_GPQA_ACCURACY": "0.7", "DSPARK_SIM_GPQA_CONCENTRATION": "0.5",
                 "DSPARK_SIM_DECODE_STEP_MS": "5"}
SMOKE, GPQA_CELL = "smoke", "gpqa198"


@dataclass(frozen=True)
class Scenario:
    matrix: str  # SMOKE (matrices/smoke.yaml, shipped baseline) or GPQA_CELL (written and recorded here)
    suites: str
    planted: dict[str, str] = field(default_factory=dict)  # extra DSPARK_SIM_* settings


# accept_prob 0.674 instead of the smoke matrix's 0.7 lowers the accept length by about 5 % (measured: 0.68 gave
# −3.9 %, 3.25 → 3.12); gpqa_accuracy 0.65 instead of 0.70 lowers every question's probability through its quantile.
E2E_SCENARIOS = {
    "clean": Scenario(SMOKE, "accept,speed,gpqa"),  # every suite the smoke cells list (sanity always runs)
    "accept_length -5%": Scenario(SMOKE, "accept", {"DSPARK_SIM_REGRESSION": "0.5.0:accept_prob=0.674"}),
    "tpot +5%": Scenario(SMOKE, "speed", {"DSPARK_SIM_FAULTS": "slow_decode=1.05"}),
    "gpqa198 clean": Scenario(GPQA_CELL, "gpqa"),
    "gpqa198 -5pt": Scenario(GPQA_CELL, "gpqa", {"DSPARK_SIM_REGRESSION": "0.5.0:gpqa_accuracy=0.65"}),
}


def gpqa_cell(out: Path) -> tuple[Path, dict[str, str]]:
    """The 198-question cell: the smoke matrix's one-node cell with only GPQA, as a matrix file of its own, and the
    environment that points the simulator and the suite at a 198-question synthetic dataset."""
    out.mkdir(parents=True, exist_ok=True)
    dataset = out / "gpqa_synthetic_198.csv"
    make_gpqa(GPQA_QUESTIONS, dataset)
    smoke = yaml.safe_load((REPO / "matrices" / "smoke.yaml").read_text())
    defaults = {key: value for key, value in smoke["defaults"].items() if key != "baseline"}
    defaults["env"] = {**defaults["env"], **GPQA_CELL_ENV}
    defaults["suites"] = {"gpqa": {"num_questions": GPQA_QUESTIONS, "repeats": GPQA_REPEATS, "concurrency": 128}}
    matrix = out / "gpqa198.yaml"
    matrix.write_text(yaml.safe_dump({"description": "GPQA-Diamond-sized cell for gate power",
                                      "sglang": smoke["sglang"],
                                      "hardware": smoke["hardware"], "defaults": defaults, "include": [{}]}))
    return matrix, {"DSPARK_SIM_GPQA_PATH": str(dataset)}


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dspark_ci", *args], cwd=REPO, env=env, capture_output=True, text=True)


def record_gpqa_baseline(out: Path, runs: int, env: dict[str, str], matrix: Path, cell_env: dict[str, str]) -> Path:
    """`dspark-ci baseline record` from ``runs`` clean runs of the 198-question cell, as a user records one."""
    run_dirs = []
    for index in range(runs):
        run_dir = out / f"baseline-{index}"
        done = _run(["run", str(matrix), "--out", str(run_dir), "-q"], {**env, **E2E_NOISE, **cell_env})
        if done.returncode != 0:
            raise RuntimeError(f"baseline run {run_dir} exited {done.returncode}: {done.stderr[-2000:]}")
        run_dirs.append(str(run_dir))
    baseline = out / "gpqa198-baseline.yaml"
    done = _run(["baseline", "record", *run_dirs, "--out", str(baseline)], env)
    if done.returncode != 0:
        raise RuntimeError(f"baseline record exited {done.returncode}: {done.stderr[-2000:]}")
    return baseline


def tally(run_dir: Path, gates: dict[str, dict[str, int]], boots: list[int]) -> None:
    for cell in json.loads((run_dir / "results.json").read_text())["cells"]:
        if cell["status"] == "rejected_as_expected":
            continue
        boots.append(len(cell.get("boots") or [cell]))
        for gate in cell["gates"]:
            counts = gates.setdefault(gate["metric"], {})
            counts[gate["verdict"]] = counts.get(gate["verdict"], 0) + 1


def e2e(nights: int, out: Path, scenarios: tuple[str, ...] = tuple(E2E_SCENARIOS), baseline_runs: int = 5) -> str:
    """``nights`` runs of each scenario; one line per scenario."""
    unknown = [name for name in scenarios if name not in E2E_SCENARIOS]
    if unknown:
        raise SystemExit(f"--e2e-scenarios: unknown {unknown}; choose from {', '.join(E2E_SCENARIOS)}")
    state = out / "state"  # never the user's history or run index, even if they set them
    env = {**os.environ, "DSPARK_STATE_DIR": str(state), "DSPARK_HISTORY": str(state / "history.sqlite")}
    lines = [f"e2e noise knobs: {' '.join(f'{k}={v}' for k, v in E2E_NOISE.items())}"]
    targets: dict[str, tuple[list[str], dict[str, str]]] = {SMOKE: (["matrices/smoke.yaml"], {})}
    if any(E2E_SCENARIOS[name].matrix == GPQA_CELL for name in scenarios):
        matrix, cell_env = gpqa_cell(out)
        baseline = record_gpqa_baseline(out, baseline_runs, env, matrix, cell_env)
        targets[GPQA_CELL] = ([str(matrix), "--baseline", str(baseline)], cell_env)
        lines.append(f"gpqa198: {GPQA_QUESTIONS} questions × {GPQA_REPEATS} repeats, {GPQA_CELL_ENV}; baseline recorded "
                     f"from {baseline_runs} clean runs ({baseline})")
    for name in scenarios:
        scenario = E2E_SCENARIOS[name]
        target, cell_env = targets[scenario.matrix]
        gates: dict[str, dict[str, int]] = {}
        codes: list[int] = []
        boots: list[int] = []
        for night in range(nights):
            run_dir = out / f"e2e-{name.replace(' ', '_')}-{night}"
            done = _run(["run", *target, "--suites", scenario.suites, "--out", str(run_dir), "-q"],
                        {**env, **E2E_NOISE, **cell_env, **scenario.planted})
            codes.append(done.returncode)
            tally(run_dir, gates, boots)
        shown = "; ".join(f"{metric} {counts}" for metric, counts in gates.items())
        lines.append(f"e2e {name}: red (exit 1) in {codes.count(1)} of {nights} runs; exit codes "
                     f"{dict(sorted((c, codes.count(c)) for c in set(codes)))}; gate verdicts (every cell): {shown}; "
                     f"{statistics.fmean(boots or [0]):.2f} boots per measured cell")
    return "\n".join(lines)
