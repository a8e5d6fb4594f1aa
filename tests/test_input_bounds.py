"""Input bounds: every bad input is exit 2 with one message naming the file:line or the argument,
before anything is launched: no server, no run directory, no traceback. Nothing is read before its type and size
are known, so /dev/zero, a FIFO, a huge file or an alias bomb fail at once instead of hanging."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from dspark_ci.ground.yaml_lines import MAX_FILE_BYTES

from tests.cli_under_test import DSPARK_CI
from tests.process_table import assert_no_process_with_env

REPO = Path(__file__).resolve().parent.parent
SMOKE = str(REPO / "matrices" / "smoke.yaml")
ONE_NODE = "dsv4-flash-tp8-a2a-none-dspark-b7-cuda"
HEAD = "hardware: {cuda: h200}\ndefaults:\n  model: m\n  tp: 1\n  gpus_per_node: 1\n"
# Nine references to nine references ... of nine strings: 9**8 values once expanded, a few hundred bytes written.
BOMB = ("laughs:\n  - &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
        + "".join(f"  - &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9)))


def run(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "run"
    tag = uuid.uuid4().hex
    done = subprocess.run([*DSPARK_CI, *args, "--out", str(out)] if args[0] == "run" else [*DSPARK_CI, *args],
                          env={**os.environ, "DSPARK_TEST_RUN": tag, **(env or {})}, cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert_no_process_with_env("DSPARK_TEST_RUN", tag)
    return done, out


def assert_refused(done: subprocess.CompletedProcess, out: Path, says: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) <= 2 and says in lines[-1], done.stderr  # at most the preflight stage line, then the message
    assert not out.exists()  # nothing was started, not even the run directory


def matrix(tmp_path: Path, text: str) -> str:
    path = tmp_path / "matrix.yaml"
    path.write_bytes(text.encode())
    return str(path)


@pytest.mark.parametrize("make, says", [
    (lambda tmp: "/dev/zero", "/dev/zero: is a character device, not a file"),
    (lambda tmp: (os.mkfifo(tmp / "fifo"), str(tmp / "fifo"))[1], "is a FIFO (named pipe), not a file"),
    (lambda tmp: str(tmp), "is a directory, not a file"),
    (lambda tmp: matrix(tmp, HEAD + "#" * MAX_FILE_BYTES), f"a YAML input is at most {MAX_FILE_BYTES // 1024} KiB"),
    (lambda tmp: matrix(tmp, HEAD + "description: a\x00b\n"), "matrix.yaml:6: control character U+0000 (NUL)"),
    (lambda tmp: matrix(tmp, "description: ring\x07\n" + HEAD), "matrix.yaml:1: control character U+0007 (BEL)"),
    (lambda tmp: (tmp / "latin1.yaml").write_bytes(b"description: caf\xe9\n") and str(tmp / "latin1.yaml"),
     "latin1.yaml:1: not UTF-8 (byte 0xe9)"),
], ids=["dev-zero", "fifo", "directory", "too-large", "nul", "bel", "latin-1"])
def test_a_file_that_is_not_a_small_text_file_is_refused_before_it_is_read(tmp_path, make, says):
    done, out = run(tmp_path, "run", make(tmp_path))
    assert_refused(done, out, says)


def test_an_alias_bomb_under_suite_options_is_refused_by_plan_and_run(tmp_path):
    path = matrix(tmp_path, BOMB + HEAD + "  suites:\n    gpqa: {chat_template_kwargs: {k: *l8}}\n"
                  "include: [{}]\n")
    for verb in ("plan", "run"):
        done, out = run(tmp_path, verb, path)
        assert_refused(done, out, "the aliases here expand to more than")


def test_a_recursive_alias_is_refused(tmp_path):
    done, out = run(tmp_path, "run", matrix(tmp_path, "loop: &loop [*loop]\n" + HEAD + "include: [{}]\n"))
    assert_refused(done, out, "matrix.yaml:1: this alias refers to itself")


@pytest.mark.parametrize("suites, says", [
    ("speed: {num_requests: 1000000000}", "speed.num_requests must be at most 100,000, got 1,000,000,000"),
    ("speed: {concurrency: 1000000}", "speed.concurrency must be at most 4,096"),
    ("speed: {output_len: 100000000}", "speed.output_len must be at most 1,048,576"),
    ("accept: {max_tokens: 1000000000000}", "accept.max_tokens must be at most 1,048,576"),
    ("gpqa: {temperature: .nan}", "gpqa.temperature must be a number, got nan"),
], ids=["num-requests", "concurrency", "output-len", "max-tokens", "nan"])
def test_counts_and_sizes_have_upper_bounds(tmp_path, suites, says):
    path = matrix(tmp_path, HEAD + f"  speculative_algorithm: DSPARK\n  suites:\n    {suites}\ninclude: [{{}}]\n")
    done, out = run(tmp_path, "run", path)
    assert_refused(done, out, "matrix.yaml:8: " + says)


def test_a_deployment_larger_than_any_machine_is_refused(tmp_path):
    path = matrix(tmp_path, HEAD.replace("tp: 1", f"tp: {2**64}").replace("gpus_per_node: 1", f"gpus_per_node: {2**64}")
                  + "include: [{}]\n")
    done, out = run(tmp_path, "run", path)
    assert_refused(done, out, "matrix.yaml:4: tp must be at most 131,072")


def test_a_missing_gpqa_dataset_is_found_before_any_server_boots(tmp_path):
    path = matrix(tmp_path, HEAD + "include:\n  - suites:\n      gpqa: {dataset: no/such/gpqa.csv}\n")
    done, out = run(tmp_path, "run", path)
    assert_refused(done, out, "matrix.yaml:7: cell m-tp1-a2a-none-cuda: gpqa.dataset no/such/gpqa.csv is not a file")


def test_the_sgl_eval_scorer_without_its_package_is_found_before_any_server_boots(tmp_path):
    try:
        import sgl_eval  # noqa: F401
        pytest.skip("sgl-eval is installed here: the scorer can run")
    except ImportError:
        pass
    path = matrix(tmp_path, HEAD + "include:\n  - suites:\n      gpqa: {scorer: sgl-eval}\n")
    done, out = run(tmp_path, "run", path)
    assert_refused(done, out, "needs the sgl-eval package, which is not installed")


def test_an_unknown_simulator_fault_is_found_before_any_server_boots(tmp_path):
    done, out = run(tmp_path, "run", SMOKE, env={"DSPARK_SIM_FAULTS": "garbage_outptu"})
    assert_refused(done, out, "DSPARK_SIM_FAULTS: unknown fault 'garbage_outptu'")


@pytest.mark.parametrize("args, says", [
    (["--suites", ""], "--suites '': names no suite"),
    (["--suites", "speed,speed"], "--suites speed,speed: names speed twice"),
    (["--cell", ONE_NODE, "--cell", ONE_NODE], f"--cell {ONE_NODE}: given twice"),
    (["--hosts", "missing.yaml"], "--hosts: is an option of the docker launcher, and this run uses --launcher local"),
], ids=["empty-suites", "suite-twice", "cell-twice", "hosts-with-local"])
def test_empty_duplicate_and_misplaced_options_are_refused(tmp_path, args, says):
    done, out = run(tmp_path, "run", SMOKE, *args)
    assert_refused(done, out, says)


@pytest.mark.parametrize("args, says", [
    (["--boot-timeout", "1e300"], "argument --boot-timeout: 1e300 seconds is more than a week"),
    (["--max-parallel", "99999999"], "argument --max-parallel: 99999999 is more than 10,000"),
], ids=["boot-timeout", "max-parallel"])
def test_the_runs_own_numbers_have_upper_bounds(tmp_path, args, says):
    done, out = run(tmp_path, "run", SMOKE, *args)
    assert_refused(done, out, says)


def test_a_host_with_more_gpus_than_any_machine_is_refused(tmp_path):
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"hosts:\n  - url: unix:///var/run/docker.sock\n    gpus: {2**64}\n")
    done, out = run(tmp_path, "run", SMOKE, "--launcher", "docker", "--hosts", str(hosts))
    assert_refused(done, out, "hosts.yaml:2: gpus must be a count or a list of device ids, each below 128")


def test_a_k8s_patch_file_that_is_a_device_is_refused_before_it_is_read(tmp_path):
    done, out = run(tmp_path, "plan", SMOKE, "--format", "k8s", "--k8s-extra", "/dev/zero")
    assert_refused(done, out, "/dev/zero: is a character device, not a file")


# --- depth, digits, names, NUL bytes, fault values, baselines, other verbs' arguments ---------------------------

DEEP = 400  # past MAX_NESTING (64), and past where PyYAML's recursion would overflow Python's stack


@pytest.mark.parametrize("text, says", [
    (HEAD + "x: " + "[" * 90000 + "]" * 90000 + "\ninclude: [{}]\n", "nested more than 64 levels deep"),
    (HEAD + "".join(" " * i + "a:\n" for i in range(DEEP)) + "include: [{}]\n", "nested more than 64 levels deep"),
    (HEAD + "  suites:\n    accept: {num_requests: " + "[" * 2000 + "1" + "]" * 2000 + "}\ninclude: [{}]\n",
     "matrix.yaml:7: lists and mappings nested more than 64 levels deep"),
    (HEAD.replace("tp: 1", "tp: " + "9" * 5001) + "include: [{}]\n", "matrix.yaml:4: a number of 5001 digits"),
    (HEAD + "  model_slug: " + "m" * 5000 + "\ninclude: [{}]\n", "it names files"),
    (HEAD + '  env: {DSPARK_SIM_SEED: "1\\0 2"}\ninclude: [{}]\n', "holds a NUL byte"),
    (HEAD + '  env: {DSPARK_SIM_FAULTS: "slow_decode=inf"}\ninclude: [{}]\n', "expected a finite number"),
], ids=["deep-flow", "deep-block", "deep-in-accept", "5001-digits", "long-model-slug", "nul-in-env",
        "slow-decode-inf"])
def test_a_matrix_past_any_sane_bound_is_refused_before_launch(tmp_path, text, says):
    done, out = run(tmp_path, "run", matrix(tmp_path, text))
    assert_refused(done, out, says)


@pytest.mark.parametrize("gate, says", [
    ("{value: 0, min_ratio: 0.9}", "value 0 is not positive"),
    ("{value: 40, max_ratio: 0.5}", "max_ratio 0.5 is below 1"),
    ("{max: -1}", "max -1 is negative"),
], ids=["value-0", "max-ratio-below-1", "negative-max"])
def test_a_baseline_value_no_gate_can_use_is_refused(tmp_path, gate, says):
    metric = "tpot_ms_median" if "max" in gate else "accept_length"  # lower is better, higher is better
    baseline = tmp_path / "baseline.yaml"
    baseline.write_text(f"schema: 1\ncells:\n  {ONE_NODE}:\n    {metric}: {gate}\n")
    done, out = run(tmp_path, "run", SMOKE, "--cell", ONE_NODE, "--baseline", str(baseline))
    assert_refused(done, out, says)


def nested_results(tmp_path: Path) -> Path:
    run_dir = tmp_path / "nested"
    run_dir.mkdir()
    (run_dir / "results.json").write_text("[" * 100_000)
    return run_dir


@pytest.mark.parametrize("args, says", [
    (lambda tmp: ["report", str(nested_results(tmp))], "nested too deeply"),
    (lambda tmp: ["baseline", "record", str(nested_results(tmp))], "nested too deeply"),
    (lambda tmp: ["baseline", "record", str(REPO / "tests"), "--out", str(tmp)], "is a directory"),
    (lambda tmp: ["cleanup", "--run", ""], "is not a run id"),
], ids=["report-nested", "baseline-nested", "baseline-out-dir", "cleanup-empty-run"])
def test_other_verbs_refuse_bad_arguments_with_one_message(tmp_path, args, says):
    done, _ = run(tmp_path, *args(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and says in done.stderr, done.stderr


def test_a_simulator_setting_the_matrix_overrides_is_said(tmp_path):
    baseline = tmp_path / "baseline.yaml"  # refused after the cells were checked: nothing is launched
    baseline.write_text(f"schema: 1\ncells:\n  {ONE_NODE}:\n    tpot_ms_median: {{max: -1}}\n")
    done, out = run(tmp_path, "run", SMOKE, "--cell", ONE_NODE, "--baseline", str(baseline),
                    env={"DSPARK_SIM_ACCEPT_PROB": "0.3"})
    assert done.returncode == 2
    assert "DSPARK_SIM_ACCEPT_PROB=0.7" in done.stderr and "DSPARK_SIM_ACCEPT_PROB=0.3" in done.stderr, done.stderr
