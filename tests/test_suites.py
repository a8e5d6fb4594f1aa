"""The measurement suites, run as a user runs them: `pytest suites/... --base-url URL --dspark-out OUT.json`
in a subprocess, against simulated SGLang servers started by hand on free loopback ports.

Each metric must land where the simulator's settings put it (within sampling error); no timing is
asserted tightly (the machine is shared): TPOT only within a generous band.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import random
import re
import statistics
import subprocess
import sys

import pytest

from tests.simulator_process import SPECULATIVE_ARGS, running_simulator
from tests.suite_runs import REPO, SYNTHETIC_GPQA, outcomes, run_suite

ALPHA, GAMMA = 0.7, 3  # the speculative simulator's acceptance probability and DSpark block size
GPQA_ACCURACY = 0.6
STEP_MS = 20.0
FAST = {"DSPARK_SIM_DECODE_STEP_MS": "1", "DSPARK_SIM_PREFILL_MS_PER_TOKEN": "0"}


def expected_accept_length(alpha: float, gamma: int) -> float:
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def accept_length_stderr(alpha: float, gamma: int, steps: int) -> float:
    """Standard error of the mean tokens per verify step (accepted + 1, truncated geometric)."""
    probs = [alpha ** k * (1 - alpha) for k in range(gamma)] + [alpha ** gamma]
    mean = sum((k + 1) * p for k, p in enumerate(probs))
    variance = sum((k + 1 - mean) ** 2 * p for k, p in enumerate(probs))
    return math.sqrt(variance / steps)


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory):
    env = {**FAST, "DSPARK_SIM_ACCEPT_PROB": str(ALPHA), "DSPARK_SIM_GPQA_PATH": str(SYNTHETIC_GPQA),
           "DSPARK_SIM_GPQA_ACCURACY": str(GPQA_ACCURACY)}
    log = tmp_path_factory.mktemp("sim") / "spec.log"
    with running_simulator(env, [*SPECULATIVE_ARGS, "--reasoning-parser", "deepseek-v4"], log_path=log) as url:
        yield url


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("sim") / "plain.log"
    with running_simulator(FAST, log_path=log) as url:
        yield url


def test_without_base_url_the_suites_are_a_usage_error_not_a_green_run():
    # Skipping everything would exit 0 having measured nothing; pytest's usage-error code says "give a target".
    done = subprocess.run([sys.executable, "-m", "pytest", "suites/", "-p", "no:cacheprovider", "-q"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "no server under test: pass --base-url http://HOST:PORT" in done.stderr
    assert "dspark-ci sim" in done.stderr and "Traceback" not in done.stdout + done.stderr
    listed = subprocess.run([sys.executable, "-m", "pytest", "suites/", "-p", "no:cacheprovider", "-q",
                             "--collect-only"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "suites/test_gpqa.py" in listed.stdout


@pytest.mark.parametrize("flag, message", [
    ("gpqa.no_such_option=1", "suite 'gpqa' has no option 'no_such_option'"),
    ("speed.concurrency=0", "speed.concurrency must be at least 1"),
    ("gpqa.extractor=perl", "gpqa.extractor must be one of sglang, openai"),
], ids=["unknown-option", "zero-concurrency", "unknown-extractor"])
def test_a_bad_suite_option_stops_pytest_with_one_line(tmp_path, flag, message):
    done = subprocess.run([sys.executable, "-m", "pytest", "suites/", "-p", "no:cacheprovider", "-q",
                           "--suite-option", flag], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert message in done.stderr and "Traceback" not in done.stderr


def test_gpqa_accuracy_is_within_two_standard_errors_of_the_configured_probability(tmp_path, spec_server):
    code, output, log = run_suite(tmp_path, "gpqa", spec_server, "--gpqa-dataset", str(SYNTHETIC_GPQA),
                                  "--suite-option", "gpqa.concurrency=16")
    assert code == 0, log
    n = output["metrics"]["gpqa_num_questions"]
    assert n == 60 and output["metrics"]["gpqa_repeats"] == 1
    stderr = math.sqrt(GPQA_ACCURACY * (1 - GPQA_ACCURACY) / n)
    assert abs(output["metrics"]["gpqa_accuracy"] - GPQA_ACCURACY) <= 2 * stderr
    accuracy = output["metrics"]["gpqa_accuracy"]
    assert output["metrics"]["gpqa_stderr"] == pytest.approx(math.sqrt(accuracy * (1 - accuracy) / (n - 1)))
    summary = output["records"]["gpqa_summary"][0]
    assert summary["dataset"]["sha256"] == hashlib.sha256(SYNTHETIC_GPQA.read_bytes()).hexdigest()
    assert summary["extractor"] == "sglang" and summary["regex"] == r"(?i)Answer\s*:\s*([A-D])"


def test_gpqa_follows_simple_evals_sampling_and_permutations(tmp_path, spec_server):
    code, output, log = run_suite(tmp_path, "gpqa", spec_server, "--gpqa-dataset", str(SYNTHETIC_GPQA),
                                  "--suite-option", "gpqa.num_questions=5", "--suite-option", "gpqa.repeats=2",
                                  "--suite-option", "gpqa.extractor=openai")
    assert code == 0, log
    rows = list(csv.DictReader(SYNTHETIC_GPQA.open(newline="")))
    rng = random.Random(0)
    chosen = rng.sample(rows, 5) * 2
    expected = [(hashlib.sha256(row["Question"].encode()).hexdigest()[:16], rng.sample(range(4), 4)) for row in chosen]
    records = output["records"]["gpqa"]
    assert [(r["question_id"], r["permutation"]) for r in records] == expected
    assert [r["repeat"] for r in records] == [0] * 5 + [1] * 5
    assert output["records"]["gpqa_summary"][0]["extractor"] == "openai"
    # Repeats of a question are one unit: the standard error is over the 5 questions' mean scores, not the 10 samples.
    means = [statistics.fmean(r["score"] for r in records if r["question_id"] == q) for q in dict.fromkeys(
        r["question_id"] for r in records)]
    assert output["metrics"]["gpqa_stderr"] == pytest.approx(statistics.stdev(means) / math.sqrt(5))
    # Every response is kept whole, so another scorer can rescore the run.
    for record in records:
        match = re.search(r"(?i)Answer\s*:\s*([A-D])", record["response"])
        assert (match.group(1) if match else None) == record["extracted_answer"]


def test_gpqa_scores_the_answer_not_the_reasoning_of_a_thinking_model(tmp_path, spec_server):
    runs = {}
    for thinking in (False, True):
        code, output, log = run_suite(tmp_path, "gpqa", spec_server, "--gpqa-dataset", str(SYNTHETIC_GPQA),
                                      "--suite-option", "gpqa.num_questions=8",
                                      "--suite-option", f"gpqa.thinking={json.dumps(thinking)}")
        assert code == 0, log
        runs[thinking] = output["records"]["gpqa"]
    assert all(r["reasoning_chars"] > 0 for r in runs[True])
    assert all(r["reasoning_chars"] == 0 for r in runs[False])
    # The simulated model's choice is fixed per question: thinking moves text, not the answer.
    assert [r["extracted_answer"] for r in runs[True]] == [r["extracted_answer"] for r in runs[False]]
    assert output["records"]["gpqa_summary"][0]["chat_template_kwargs"] == {"thinking": True, "enable_thinking": True}


@pytest.mark.parametrize("launch, window_start", [
    ([], "counter values before the window"),  # SGLang's startup warmup has moved the counters
    (["--skip-server-warmup"], "counters absent before the window (fresh server): counted from zero"),
], ids=["after-warmup", "skip-server-warmup"])
def test_accept_length_and_rate_match_alpha_and_gamma(tmp_path, launch, window_start):
    # A fresh server, so its cumulative /server_info figure covers exactly the suite's requests.
    # every category alike, so one alpha governs the whole workload (tests/test_accept_positions.py: by category)
    env = {**FAST, "DSPARK_SIM_ACCEPT_PROB": str(ALPHA), "DSPARK_SIM_CATEGORY_ACCEPT": ""}
    args = [*SPECULATIVE_ARGS, "--enable-metrics", *launch]
    with running_simulator(env, args, log_path=tmp_path / "sim.log") as url:
        code, output, log = run_suite(tmp_path, "accept", url, "--suite-option", "accept.num_requests=24",
                                      "--suite-option", "accept.max_tokens=200")
    assert code == 0, log
    requests = output["records"]["accept"]
    steps = sum(r["spec_verify_ct"] for r in requests)
    per_step = expected_accept_length(ALPHA, GAMMA)
    # SGLang divides all completion tokens by verify steps: each request's first token (from prefill) adds
    # 1/steps; the last step of a request, cut at max_tokens, takes away at most about as much.
    first_tokens = len(requests) / steps
    tolerance = 4 * accept_length_stderr(ALPHA, GAMMA, steps) + first_tokens
    assert output["metrics"]["accept_length"] == pytest.approx(per_step + first_tokens, abs=tolerance)
    assert output["metrics"]["accept_rate"] == pytest.approx((per_step - 1) / GAMMA, abs=tolerance / GAMMA)
    figures = {figure["source"]: figure for figure in output["records"]["accept_server"]}
    assert figures["/metrics counters"]["exact_window"] and figures["/server_info internal_states"]["exact_window"]
    assert figures["/metrics counters"]["window_start"] == window_start
    assert figures["/metrics counters"]["verify_calls"] == steps  # exactly the suite's requests
    [summary] = output["records"]["accept_summary"]
    assert summary["metrics_cross_check"] and summary["no_metrics_cross_check_because"] is None
    assert output["warnings"] == summary["disagreements"] == []  # per-request and server-side figures agree


def test_accept_floor_fails_when_acceptance_collapses(tmp_path):
    env = {**FAST, "DSPARK_SIM_FAULTS": "accept_collapse"}
    with running_simulator(env, SPECULATIVE_ARGS, log_path=tmp_path / "sim.log") as url:
        code, output, log = run_suite(tmp_path, "accept", url, "--suite-option", "accept.num_requests=4")
    assert code == pytest.ExitCode.TESTS_FAILED, log
    # 1.0 per verify step; SGLang's figure adds each request's first (prefill) token over its steps.
    assert 1.0 <= output["metrics"]["accept_length"] < 1.05
    assert output["metrics"]["accept_rate"] == 0.0
    floor = [t for t in output["tests"] if t["nodeid"].endswith("test_accept_length_above_collapse_floor")][0]
    assert floor["outcome"] == "failed" and "collapse floor 1.2" in floor["message"]
    [summary] = output["records"]["accept_summary"]  # launched without --enable-metrics
    assert not summary["metrics_cross_check"]
    assert summary["no_metrics_cross_check_because"].startswith("/metrics not served")


def test_accept_skips_on_a_server_without_speculation(tmp_path, plain_server):
    code, output, log = run_suite(tmp_path, "accept", plain_server)
    assert code == 0, log
    assert set(outcomes(output).values()) == {"skipped"}
    assert "without speculative decoding" in output["tests"][0]["message"]
    assert "accept_length" not in output["metrics"]


def test_speed_tpot_is_step_time_over_accept_length(tmp_path):
    env = {"DSPARK_SIM_ACCEPT_PROB": str(ALPHA), "DSPARK_SIM_DECODE_STEP_MS": str(STEP_MS)}
    options = ["speed.num_requests=16", "speed.concurrency=8", "speed.output_len=48", "speed.input_len=200",
               "speed.warmup_requests=2"]
    with running_simulator(env, SPECULATIVE_ARGS, log_path=tmp_path / "sim.log") as url:
        code, output, log = run_suite(tmp_path, "speed", url, *[a for o in options for a in ("--suite-option", o)])
    assert code == 0, log
    metrics = output["metrics"]
    expected_tpot = STEP_MS / expected_accept_length(ALPHA, GAMMA)
    assert 0.6 * expected_tpot <= metrics["tpot_ms_mean"] <= 1.8 * expected_tpot  # generous: shared machine
    assert metrics["output_tokens_mean"] == 48
    assert metrics["input_tokens_mean"] == pytest.approx(200, rel=0.25)
    assert metrics["ttft_ms_median"] <= metrics["ttft_ms_p99"]
    assert len(output["records"]["speed"]) == 16  # warm-up excluded
    # Each record names its stream, so it joins with server-side logs (the simulator's emission log, SGLang's rid).
    assert len({r["response_id"] for r in output["records"]["speed"]}) == 16


def test_speed_fails_with_the_reason_when_streams_break_off(tmp_path):
    env = {**FAST, "DSPARK_SIM_FAULTS": "malformed_stream"}
    with running_simulator(env, log_path=tmp_path / "sim.log") as url:
        code, output, log = run_suite(tmp_path, "speed", url, "--suite-option", "speed.num_requests=4",
                                      "--suite-option", "speed.warmup_requests=0")
    assert code == pytest.ExitCode.TESTS_FAILED, log
    [test] = output["tests"]
    assert test["outcome"] == "failed" and "streamed requests failed" in test["message"]


def test_parity_is_zero_against_the_same_model_without_speculation(tmp_path, spec_server, plain_server):
    code, output, log = run_suite(tmp_path, "parity", spec_server, "--reference-url", plain_server)
    assert code == 0, log
    assert output["metrics"]["parity_mismatches"] == 0
    assert all(r["match"] and r["first_difference"] is None for r in output["records"]["parity"])


def test_parity_counts_garbage_output_as_mismatches(tmp_path, plain_server):
    env = {**FAST, "DSPARK_SIM_FAULTS": "garbage_output"}
    with running_simulator(env, SPECULATIVE_ARGS, log_path=tmp_path / "sim.log") as url:
        code, output, log = run_suite(tmp_path, "parity", url, "--reference-url", plain_server)
    assert code == pytest.ExitCode.TESTS_FAILED, log
    assert output["metrics"]["parity_mismatches"] > 0
    assert any(r["first_difference"] is not None for r in output["records"]["parity"])


def test_parity_reports_where_an_altered_reference_differs(tmp_path, spec_server):
    saved = tmp_path / "reference.json"
    code, _, log = run_suite(tmp_path, "parity", spec_server, "--save-reference", str(saved),
                             "--suite-option", "parity.num_prompts=3")
    assert code == 0, log
    reference = json.loads(saved.read_text())
    altered = reference["outputs"][1]
    position = 5
    if altered["token_ids"]:
        altered["token_ids"][position] += 1
    altered["text"] = altered["text"][:position] + "#" + altered["text"][position + 1:]
    saved.write_text(json.dumps(reference))

    code, output, log = run_suite(tmp_path, "parity", spec_server, "--reference-file", str(saved))
    assert code == pytest.ExitCode.TESTS_FAILED, log
    assert output["metrics"]["parity_mismatches"] == 1
    differing = [r for r in output["records"]["parity"] if not r["match"]]
    assert [(r["prompt_index"], r["first_difference"]) for r in differing] == [(1, position)]


@pytest.fixture
def not_sglang():
    """Something that answers HTTP but is no OpenAI-compatible server: a static file server."""
    import http.server
    import threading

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.mark.parametrize("suite", ["gpqa", "accept", "speed", "parity"])
@pytest.mark.parametrize("model", [[], ["--model", "m"]], ids=["any-model", "model-given"])
def test_a_server_that_is_not_sglang_is_named_in_one_line_and_never_passes(not_sglang, suite, model):
    done = subprocess.run([sys.executable, "-m", "pytest", f"suites/test_{suite}.py", "-p", "no:cacheprovider", "-q",
                           "--base-url", not_sglang, *model, "--gpqa-dataset", "suites/data/gpqa_synthetic.csv"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout
    assert (f"{not_sglang} answers, but not as an OpenAI-compatible SGLang server: GET {not_sglang}/v1/models gave "
            "HTTP 404 (SimpleHTTP") in done.stdout
    assert "Traceback" not in done.stdout and "During handling" not in done.stdout
    # One line per test that could not start, under pytest's own header for it: nothing else is printed.
    said = f"{not_sglang} answers, but not as an OpenAI-compatible SGLang server"
    stray = [line for line in done.stdout.splitlines()
             if not (line.startswith(said)
                     or re.fullmatch(r"[_=]+ .* [_=]+|[EF.s]+ +\[100%\]|\d+ (errors?|failed)\b.*", line)
                     or line.startswith(("ERROR suites/", "FAILED suites/")))]
    assert stray == [], done.stdout
