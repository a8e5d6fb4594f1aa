"""GPQA by each scorer users compare with, as they see it: the real sgl-eval CLI and our suite with
``scorer: sgl-eval`` on one simulator, `dspark-ci rescore` of a run, Ctrl-C in the middle of GPQA.

The sgl-eval tests need the sgl-eval package (`pip install -e '.[sgl-eval]'`) and are skipped with that
reason without it; it is not in `.[test]` (docs/DEVELOPMENT.md: about 550 MB of dependencies, and it pins openai<3).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_under_test import DSPARK_CI
from tests.simulator_process import running_simulator
from tests.suite_runs import REPO, SYNTHETIC_GPQA, run_suite
from tests.test_run_cli import ONE_NODE, Run

HAVE_SGL_EVAL = importlib.util.find_spec("sgl_eval") is not None
needs_sgl_eval = pytest.mark.skipif(not HAVE_SGL_EVAL, reason="sgl-eval is not installed: pip install -e '.[sgl-eval]'")
SIM_ENV = {"DSPARK_SIM_DECODE_STEP_MS": "1", "DSPARK_SIM_PREFILL_MS_PER_TOKEN": "0",
           "DSPARK_SIM_GPQA_PATH": str(SYNTHETIC_GPQA), "DSPARK_SIM_GPQA_ACCURACY": "0.6"}


def smoke_matrix(tmp_path: Path, gpqa_options: str) -> str:
    """matrices/smoke.yaml with other gpqa options (and its baseline found from where the copy lies)."""
    text = (REPO / "matrices" / "smoke.yaml").read_text()
    text = text.replace("gpqa: {num_questions: 20}", f"gpqa: {{{gpqa_options}}}")
    text = text.replace("../baselines/smoke.yaml", str(REPO / "baselines" / "smoke.yaml"))
    path = tmp_path / "smoke.yaml"
    path.write_text(text)
    return str(path)


@needs_sgl_eval
def test_the_sgl_eval_cli_and_our_suite_score_every_sample_alike(tmp_path):
    import csv

    from dspark_ci.suites import sgl_eval_scorer

    rows = list(csv.DictReader(SYNTHETIC_GPQA.open(newline="")))
    dataset = tmp_path / "gpqa.jsonl"  # NeMo-Skills' shape, prepared by sgl-eval's own format_entry
    dataset.write_text("".join(json.dumps(entry) + "\n" for entry in sgl_eval_scorer.entries(rows)))
    with running_simulator(SIM_ENV, log_path=tmp_path / "sim.log") as url:
        done = subprocess.run([sys.executable, "-m", "sgl_eval.cli", "run", "gpqa", "--base-url", f"{url}/v1",
                               "--from-dataset", str(dataset), "--n-repeats", "2", "--num-threads", "8",
                               "--no-thinking", "--max-tokens", "2048", "--out-dir", str(tmp_path / "sgl-eval")],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        code, ours, log = run_suite(tmp_path, "gpqa", url, "--gpqa-dataset", str(SYNTHETIC_GPQA),
                                    "--suite-option", "gpqa.scorer=sgl-eval", "--suite-option", "gpqa.repeats=2",
                                    # what the CLI was told above (its defaults are ours otherwise)
                                    "--suite-option", "gpqa.thinking=false", "--suite-option", "gpqa.max_tokens=2048")
    assert code == 0, log
    [run_dir] = (tmp_path / "sgl-eval").iterdir()
    theirs = {}
    for repeat in range(2):
        for line in (run_dir / f"output-rs{repeat}.jsonl").read_text().splitlines():
            pred = json.loads(line)
            theirs[(int(pred["id"].split("-")[-1]), repeat)] = (pred["predicted_answer"],
                                                                float(pred["symbolic_correct"]))
    records = ours["records"]["gpqa"]
    mine = {(index % len(rows), r["repeat"]): (r["extracted_answer"], r["score"]) for index, r in enumerate(records)}
    assert len(theirs) == len(mine) == 2 * len(rows)
    assert mine == theirs
    aggregate = json.loads((run_dir / "metrics.json").read_text())["aggregate"]
    summary = ours["records"]["gpqa_summary"][0]
    assert ours["metrics"]["gpqa_accuracy"] == pytest.approx(aggregate["score"])
    for key in ("pass@2", "majority@2", "no_answer"):
        assert summary["aggregate"][key] == pytest.approx(aggregate[key])
    assert summary["scorer"] == "sgl-eval" and summary["sgl_eval_version"]


def test_the_sgl_eval_scorer_without_the_package_says_how_to_install_it(tmp_path):
    absent = tmp_path / "absent" / "sgl_eval"
    absent.mkdir(parents=True)
    (absent / "__init__.py").write_text("raise ImportError('sgl_eval hidden by the test')\n")
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "suites/test_gpqa.py", "-p", "no:cacheprovider", "-q",
                           "--base-url", "http://127.0.0.1:9", "--model", "m", "--dspark-out", str(out),
                           "--gpqa-dataset", str(SYNTHETIC_GPQA), "--suite-option", "gpqa.scorer=sgl-eval"],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(absent.parent)})
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    [test] = json.loads(out.read_text())["tests"]
    assert test["outcome"] == "error"
    assert "needs the sgl-eval package" in test["message"] and "pip install -e '.[sgl-eval]'" in test["message"]


def test_too_few_max_tokens_warns_about_the_no_answer_rate_with_the_hint(tmp_path):
    with running_simulator(SIM_ENV, log_path=tmp_path / "sim.log") as url:
        code, output, log = run_suite(tmp_path, "gpqa", url, "--gpqa-dataset", str(SYNTHETIC_GPQA),
                                      "--suite-option", "gpqa.num_questions=10", "--suite-option", "gpqa.max_tokens=8",
                                      "--suite-option", "gpqa.repeats=2", "--suite-option", "gpqa.scorer=simple-evals")
    assert code == 0, log
    summary = output["records"]["gpqa_summary"][0]
    assert summary["aggregate"]["no_answer"] == 1.0 and summary["aggregate"]["pass@2"] == 0.0
    [warning] = output["warnings"]
    assert "20 of 20 responses (100%) have no answer the simple-evals scorer can extract" in warning
    assert "raise gpqa.max_tokens" in warning


def test_rescore_prints_the_figure_as_run_and_rescored_and_the_report_names_the_scorer(tmp_path):
    options = "num_questions: 20, repeats: 1, scorer: sgl-eval" if HAVE_SGL_EVAL else "num_questions: 20, scorer: sglang"
    scorer = "sgl-eval" if HAVE_SGL_EVAL else "sglang"
    run = Run(tmp_path, smoke_matrix(tmp_path, options), "--cell", ONE_NODE, "--suites", "gpqa")
    done = run()
    assert done.returncode == 0, done.stdout + done.stderr
    cell = run.cell(ONE_NODE)
    assert cell["gpqa"]["scorer"] == scorer and cell["gpqa"]["partial"] is False
    # The progress line follows the samples as they are scored (in CI: plain lines).
    accuracy = f"{cell['metrics']['gpqa_accuracy']:.1%}"
    assert f"measuring (sanity, gpqa) · gpqa 20/20 requests, accuracy {accuracy}" in done.stderr
    assert f"Accuracy (scorer {scorer}" in (run.out / "report.md").read_text()
    assert len((run.out / "logs" / ONE_NODE / "gpqa-samples.jsonl").read_text().splitlines()) == 20

    rescored = subprocess.run([*DSPARK_CI, "rescore", str(run.out), "--scorer", "simple-evals"],
                              capture_output=True, text=True, timeout=120, cwd=REPO)
    assert rescored.returncode == 0, rescored.stderr
    [line] = [line for line in rescored.stdout.splitlines() if line.startswith(ONE_NODE)]
    # The simulator ends with one "Answer: X" line: every scorer reads the same letter.
    assert f"{accuracy} ± " in line and f" {scorer} " in line and line.count(accuracy) == 2
    assert " simple-evals " in line


def test_rescore_of_a_directory_without_gpqa_samples_is_bad_input(tmp_path):
    done = subprocess.run([*DSPARK_CI, "rescore", str(tmp_path), "--scorer", "sglang"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2
    assert "no GPQA samples recorded" in done.stderr


def test_ctrl_c_during_gpqa_keeps_the_scored_samples_and_marks_the_figure_partial(tmp_path):
    run = Run(tmp_path, smoke_matrix(tmp_path, "num_questions: 60, concurrency: 2"), "--cell", ONE_NODE,
              "--suites", "gpqa", faults="slow_decode=5")
    samples = run.out / "logs" / ONE_NODE / "gpqa-samples.jsonl"
    process = run.start()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (samples.exists() and len(samples.read_text().splitlines()) >= 4):
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=90)
    assert process.returncode == 130, output
    run.assert_nothing_left()
    kept = [json.loads(line) for line in samples.read_text().splitlines()]
    assert 4 <= len(kept) < 60 and all(r["response"] for r in kept)
    cell = run.cell(ONE_NODE)
    assert cell["status"] == "error" and "interrupted" in cell["error"]
    assert cell["gpqa"]["partial"] is True and cell["gpqa"]["samples"] == len(kept)
    assert "gpqa_accuracy" not in cell["metrics"]  # a partial figure is never gated
    report = (run.out / "report.md").read_text()
    assert "PARTIAL" in report and "(partial: not gated)" in report
