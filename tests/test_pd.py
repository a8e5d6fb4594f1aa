"""Prefill/decode disaggregated cells: the matrix, the plan, the simulator's transfer behind the real sglang-router,
the equivalence gate against colocated, and `dspark-ci run` of a PD cell green, red on acceptance, red naming the
decode rank."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests
from dspark_ci.ground import stats
from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.processes import free_port
from dspark_ci.launchers.pd.pd_plan import plan_pd
from dspark_ci.matrices import load_cells

from dspark_ci.pd_accept import equivalence
from tests.process_table import assert_no_process_with_env
from tests.suite_runs import outcomes

REPO = Path(__file__).resolve().parent.parent
PD = str(REPO / "matrices" / "pd.yaml")
ONE_EACH = "dsv4-flash-tp8-a2a-none-dspark-b7-cuda-pd-p1tp8-d1tp8"
TWO_EACH = "dsv4-flash-tp8-a2a-none-dspark-b7-cuda-pd-p2tp8cp8-d2tp8dp8dpattn"
HAS_ROUTER = importlib.util.find_spec("sglang_router") is not None
needs_router = pytest.mark.skipif(not HAS_ROUTER, reason="sglang-router is not installed (pip install 'dspark-ci[pd]')")


def _cell(cell_id: str):
    return next(c for c in load_cells([PD]) if c.id == cell_id)


def test_plan_gives_every_role_rank_and_the_router():
    plan = plan_pd(_cell(TWO_EACH))
    assert [(i.role, i.index) for i in plan.instances] == [("prefill", 0), ("prefill", 1), ("decode", 0), ("decode", 1)]
    prefill = plan.of("prefill")[1].plan.ranks[0].argv
    assert prefill[:3] == ("python3", "-m", "sglang.launch_server")
    text = " ".join(prefill)
    assert "--disaggregation-mode prefill" in text and "--disaggregation-bootstrap-port 8999" in text
    assert "--disaggregation-transfer-backend mooncake" in text and "--attn-cp-size 8" in text
    decode = " ".join(plan.of("decode")[0].plan.ranks[0].argv)
    assert "--disaggregation-mode decode" in decode and "--attn-dp-size 8" in decode
    assert "--disaggregation-bootstrap-port" not in decode  # decode learns it per request from the router
    router = " ".join(plan.router.argv)
    assert router.startswith("python3 -m sglang_router.launch_router")
    assert ("--pd-disaggregation --prefill http://${PREFILL0_ADDR}:30000 8998 --prefill http://${PREFILL1_ADDR}:30000 "
            "8999 --decode http://${DECODE0_ADDR}:30000 --decode http://${DECODE1_ADDR}:30000") in router


def test_plan_verb_shows_the_commands(capsys):
    from dspark_ci.cli import main
    assert main(["plan", PD, "--format", "json"]) == 0
    cell = next(c for c in json.loads(capsys.readouterr().out)["cells"] if c["id"] == ONE_EACH)
    assert cell["roles"]["decode"]["config"]["disaggregation_mode"] == "decode"
    assert [i["role"] for i in cell["pd"]["instances"]] == ["prefill", "decode"]
    assert cell["pd"]["router"]["argv"][:3] == ["python3", "-m", "sglang_router.launch_router"]


@pytest.mark.parametrize("text, says", [
    ("roles: {prefill: {count: 1}}", "roles has no decode"),
    ("roles: {prefill: {count: 1}, decode: {count: 0}}", "count must be an integer >= 1"),
    ("roles: {prefill: {}, decode: {}, mixed: {}}", "unknown role key 'mixed'"),
    ("router: {prefill_policy: round_robin}", "router is set but the cell has no roles"),
    ("roles: {prefill: {}, decode: {disaggregation_transfer_backend: nixl}}", "unknown decode role key"),
])
def test_bad_roles_are_refused_with_their_line(tmp_path, text, says):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(f"hardware: {{cuda: h200}}\ninclude:\n  - model: m\n    {text}\n")
    with pytest.raises(BadInput) as err:
        load_cells([str(matrix)])
    assert says in str(err.value) and f"{matrix}:" in str(err.value)


def _metrics_text(**histograms: tuple[float, int]) -> str:
    """/metrics as SGLang exposes it, with each histogram's Σ seconds and count: ``prefill_bootstrap=(0.5, 10)`` is
    the per-stage family's series of that stage, ``queue_time=(...)`` sglang:queue_time_seconds."""
    lines = ["# TYPE sglang:per_stage_req_latency_seconds histogram", "# TYPE sglang:queue_time_seconds histogram"]
    for name, (seconds, count) in histograms.items():
        family, labels = (("sglang:queue_time_seconds", 'tp_rank="0"') if name == "queue_time" else
                          ("sglang:per_stage_req_latency_seconds", f'stage="{name}",tp_rank="0"'))
        lines += [f'{family}_bucket{{{labels},le="+Inf"}} {count}', f"{family}_sum{{{labels}}} {seconds}",
                  f"{family}_count{{{labels}}} {count}"]
    return "\n".join(lines) + "\n"


def test_ttft_split_is_each_stages_window_mean_over_the_role_and_says_what_the_server_does_not_report():
    from dspark_ci.suites.config import RoleURL
    from dspark_ci.suites.ttft_split import RoleReading, parse_totals, ttft_split
    prefills = RoleURL("prefill", "http://p0"), RoleURL("prefill", "http://p1")
    decode = RoleURL("decode", "http://d0")
    idle = parse_totals(_metrics_text(prefill_bootstrap=(1.0, 10), queue_time=(2.0, 10),
                                      prefill_transfer_kv_cache=(0.1, 10), decode_waiting=(0.0, 0)))
    before = (RoleReading(prefills[0], idle), RoleReading(prefills[1], idle), RoleReading(decode, idle))
    after = (  # the window: 4 requests on prefill 0, 6 on prefill 1; the decode server times no fake_output
        RoleReading(prefills[0], parse_totals(_metrics_text(prefill_bootstrap=(1.4, 14), queue_time=(2.4, 14),
                                                            prefill_transfer_kv_cache=(0.14, 14)))),
        RoleReading(prefills[1], parse_totals(_metrics_text(prefill_bootstrap=(1.6, 16), queue_time=(2.3, 16),
                                                            prefill_transfer_kv_cache=(0.16, 16)))),
        RoleReading(decode, parse_totals(_metrics_text(decode_waiting=(0.02, 10)))),
    )
    split = ttft_split(before, after)
    # (0.4 + 0.6) s over 10 bootstraps and (0.4 + 0.3) s over 10 queue waits: 100 ms + 70 ms
    assert split.metrics == pytest.approx({"ttft_prefill_queue_ms": 170.0, "ttft_transfer_ms": 10.0})
    assert split.not_reported == ('ttft_first_decode_ms not reported by the server (no '
                                  'sglang:per_stage_req_latency_seconds{stage="fake_output"} observed on the decode '
                                  'server in the window)',)
    unserved = ttft_split(before, (*after[:2], RoleReading(decode, None)))
    assert "the decode server serves no /metrics" in unserved.not_reported[0]


def test_role_urls_name_a_pd_role_and_its_server():
    from dspark_ci.suites.config import RoleURL, SuiteInputError
    assert RoleURL.parse("prefill=http://10.0.0.1:30000/v1/") == RoleURL("prefill", "http://10.0.0.1:30000")
    for bad in ("mixed=http://h:1", "http://h:1", "decode="):
        with pytest.raises(SuiteInputError, match="expected ROLE=URL with ROLE one of prefill, decode"):
            RoleURL.parse(bad)


def test_report_shows_a_pd_cells_ttft_split_and_what_the_servers_did_not_report():
    from dspark_ci.ground.records import CellResult, RunResults, Status
    from dspark_ci.ground.sglang.settings import CellConfig
    from dspark_ci.reports.markdown import render_markdown
    cell = CellResult(id="pd", config=CellConfig(speculative_algorithm="DSPARK"), expect={"outcome": "serve"},
                      status=Status.PASSED, metrics={"ttft_ms_mean": 41.0, "ttft_prefill_queue_ms": 3.3,
                                                     "ttft_first_decode_ms": 5.5})
    text = render_markdown(RunResults("r1", None, None, "local", (), cells=(cell,)))
    assert "| Avg TTFT (ms) | Prefill queue (ms) | KV transfer (ms) | First decode (ms) |" in text
    assert "| 41.0 | 3.3 | not reported by the server | 5.5 |" in text
    colocated = render_markdown(RunResults("r1", None, None, "local", (), cells=(
        CellResult(id="c", config=CellConfig(), expect={"outcome": "serve"}, status=Status.PASSED,
                   metrics={"ttft_ms_mean": 41.0}),)))
    assert "Prefill queue" not in colocated


def test_equivalence_passes_equal_fails_shifted_and_says_inconclusive_when_unsure():
    rng = random.Random(1)
    base = [rng.gauss(3.0, 0.4) for _ in range(60)]
    same = [rng.gauss(3.0, 0.4) for _ in range(60)]
    assert equivalence(same, base).verdict == stats.PASSED
    assert equivalence([x * 0.7 for x in same], base).verdict == stats.REGRESSED
    noisy = [rng.gauss(2.8, 2.0) for _ in range(4)]
    assert equivalence(noisy, base[:4]).verdict == stats.INCONCLUSIVE


class Group:
    """A prefill and a decode simulator and the real sglang-router over them, on loopback."""

    def __init__(self, tmp_path: Path, prefill_faults: str = ""):
        self.procs: list[subprocess.Popen] = []
        self.tag = uuid.uuid4().hex
        env = {**os.environ, "DSPARK_SIM_BOOT_SECONDS": "0", "DSPARK_SIM_DECODE_STEP_MS": "1",
               "DSPARK_SIM_PREFILL_FAULTS": prefill_faults, "DSPARK_TEST_RUN": self.tag}
        common = ["--model-path", "deepseek-ai/DeepSeek-V4-Flash", "--tp-size", "8", "--speculative-algorithm",
                  "DSPARK", "--speculative-dspark-block-size", "7", "--host", "127.0.0.1"]
        self.prefill, self.decode, self.bootstrap, self.port = free_port(), free_port(), free_port(), free_port()
        self._start([sys.executable, "-m", "dspark_ci.sglang_sim", *common, "--disaggregation-mode", "prefill",
                     "--disaggregation-bootstrap-port", str(self.bootstrap), "--port", str(self.prefill)], env, tmp_path)
        self._start([sys.executable, "-m", "dspark_ci.sglang_sim", *common, "--disaggregation-mode", "decode",
                     "--port", str(self.decode)], env, tmp_path)
        self._start([sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port",
                     str(self.port), "--prometheus-port", str(free_port()), "--pd-disaggregation", "--prefill",
                     f"http://127.0.0.1:{self.prefill}", str(self.bootstrap), "--decode",
                     f"http://127.0.0.1:{self.decode}"], env, tmp_path)
        self._wait()

    def _start(self, argv, env, tmp_path):
        log = open(tmp_path / f"p{len(self.procs)}.log", "w")
        self.procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))

    def _wait(self):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                listed = requests.get(f"http://127.0.0.1:{self.port}/workers", timeout=5).json()["workers"]
                if sum(w["is_healthy"] for w in listed) == 2:
                    return
            except (requests.RequestException, ValueError, KeyError):
                pass
            time.sleep(0.5)
        raise AssertionError("the router never listed both workers healthy")

    def accept_length(self, n: int = 12) -> float:
        tokens = verify = 0
        for i in range(n):
            body = requests.post(f"http://127.0.0.1:{self.port}/v1/completions", timeout=60, json={
                "model": "deepseek-ai/DeepSeek-V4-Flash", "prompt": f"question {i}", "max_tokens": 64,
                "temperature": 0, "return_spec_tokens_details": True}).json()
            assert body["choices"][0]["text"].strip()  # the text holds whatever the hidden state
            details = body["sglext"]["spec_tokens_details"]
            tokens, verify = tokens + body["usage"]["completion_tokens"], verify + details["spec_verify_ct"]
        return tokens / verify

    def close(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(timeout=30)
        assert_no_process_with_env("DSPARK_TEST_RUN", self.tag)


@needs_router
def test_router_hands_the_transfer_and_random_hidden_states_lower_acceptance_only(tmp_path):
    good = Group(tmp_path / "good" if (tmp_path / "good").mkdir() is None else tmp_path)
    try:
        healthy = good.accept_length()
    finally:
        good.close()
    (tmp_path / "bad").mkdir()
    bad = Group(tmp_path / "bad", prefill_faults="pd_random_hidden")
    try:
        blind = bad.accept_length()
        assert requests.get(f"http://127.0.0.1:{bad.decode}/health", timeout=5).status_code == 200
    finally:
        bad.close()
    assert blind < healthy * 0.8, (blind, healthy)


@needs_router
def test_a_failed_transfer_fails_the_request_at_decode(tmp_path):
    group = Group(tmp_path, prefill_faults="pd_transfer_fail")
    try:
        answer = requests.post(f"http://127.0.0.1:{group.port}/v1/completions", timeout=60, json={
            "model": "deepseek-ai/DeepSeek-V4-Flash", "prompt": "hi", "max_tokens": 8})
        assert answer.status_code >= 500 and "KVTransferError" in answer.text
    finally:
        group.close()


def _run(tmp_path: Path, env: dict, timeout: float = 400, args: tuple[str, ...] = ()
         ) -> tuple[subprocess.CompletedProcess, dict]:
    tag = uuid.uuid4().hex
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "dspark_ci", "run", PD, "--cell", ONE_EACH, "--out", str(out), *args],
                          env={**os.environ, "CI": "true", "DSPARK_TEST_RUN": tag, **env}, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)
    assert_no_process_with_env("DSPARK_TEST_RUN", tag)
    return done, json.loads((out / "results.json").read_text())["cells"][0]


def _gate(cell: dict) -> dict:
    return next(g for g in cell["gates"] if g["metric"] == "accept_length_pd_vs_colocated")


@needs_router
def test_run_pd_cell_green_through_the_router(tmp_path):
    done, cell = _run(tmp_path, {})
    assert done.returncode == 0, done.stdout + done.stderr
    assert cell["status"] == "passed" and _gate(cell)["verdict"] == "passed"
    assert cell["metrics"]["parity_mismatches"] == 0  # greedy text holds through PD
    logs = tmp_path / "run" / "logs" / ONE_EACH
    assert (logs / "router.log").exists() and (logs / "prefill-0").is_dir() and (logs / "decode-0").is_dir()


@needs_router
def test_run_pd_cell_splits_ttft_into_prefill_queue_transfer_and_first_decode(tmp_path):
    done, cell = _run(tmp_path, {}, args=("--suites", "speed"))
    assert done.returncode == 0, done.stdout + done.stderr
    metrics = cell["metrics"]
    parts = [metrics[name] for name in ("ttft_prefill_queue_ms", "ttft_transfer_ms", "ttft_first_decode_ms")]
    assert all(part > 0 for part in parts), parts
    # server-side stages, the prefill's forward and what the router and the client add left out: never past the
    # TTFT the client measured
    assert sum(parts) <= metrics["ttft_ms_mean"], (parts, metrics["ttft_ms_mean"])
    assert metrics["ttft_first_decode_ms"] >= 5.0  # the prebuilt batch: one decode step (DSPARK_SIM_DECODE_STEP_MS)
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| Avg TTFT (ms) | Prefill queue (ms) | KV transfer (ms) | First decode (ms) |" in report


@needs_router
def test_run_prefill_stall_red_naming_the_prefill_before_a_request_would_time_out(tmp_path):
    from dspark_ci.ground.suites import SUITE_DEFAULTS

    from dspark_ci.suite_runner import REQUEST_BASE_S, REQUEST_PER_TOKEN_S
    done, cell = _run(tmp_path, {"DSPARK_SIM_PREFILL_FAULTS": "pd_prefill_stall"})
    assert done.returncode != 0 and cell["status"] in ("error", "failed")
    assert "prefill rank 0 stopped finishing requests" in cell["error"], cell["error"]
    assert "sglang:num_requests_total" in cell["error"]  # what it read, so a user can look for themselves
    # the sanity check's requests come first: red before the first of them would have timed out
    first_timeout = REQUEST_BASE_S + REQUEST_PER_TOKEN_S * SUITE_DEFAULTS["sanity"]["max_tokens"]
    assert cell["measure_seconds"] < first_timeout, cell["measure_seconds"]


def test_a_prefill_holding_requests_without_finishing_one_is_stalled_until_it_finishes_one():
    from dspark_ci.launchers.pd.prefill_watch import PrefillLoad, StallClock, prefill_load
    clock = StallClock()
    for now, load in ((0.0, PrefillLoad(held=0, finished=5)), (1.0, PrefillLoad(held=3, finished=5)),
                      (31.0, PrefillLoad(held=4, finished=5))):
        clock.observe(load, now)
    assert clock.stalled_for(31.5) == 30.5
    clock.observe(PrefillLoad(held=4, finished=6), 32.0)  # one finished: it moves
    assert clock.stalled_for(40.0) == 0.0
    clock.observe(None, 41.0)  # no /metrics to judge by: never a stall
    assert clock.stalled_for(90.0) == 0.0
    text = ('sglang:num_queue_reqs{tp_rank="0"} 2\nsglang:num_running_reqs{tp_rank="0"} 1\n'
            'sglang:num_running_reqs{tp_rank="1",dp_rank="1"} 1\n'
            'sglang:num_requests_total{is_streaming="true"} 7\nsglang:num_requests_total{is_streaming="false"} 2\n')
    assert prefill_load(text) == PrefillLoad(held=4, finished=9)
    assert prefill_load("sglang:num_requests_total 3\n") is None  # a server without the scheduler's gauges


@needs_router
def test_run_random_hidden_states_red_on_acceptance_against_colocated(tmp_path):
    done, cell = _run(tmp_path, {"DSPARK_SIM_PREFILL_FAULTS": "pd_random_hidden"})
    assert done.returncode == 1 and cell["status"] == "failed", done.stderr[-4000:]
    assert _gate(cell)["verdict"] == "regressed" and _gate(cell)["effect"] < -0.1
    assert outcomes(cell)["test_streams_parse_text_is_text_usage_adds_up"] == "passed"  # the text still parses
    assert cell["metrics"]["parity_mismatches"] == 0


@needs_router
def test_run_decode_rank_killed_red_naming_the_decode_rank(tmp_path):
    # 5 s after start: while the cell measures (its suites take about 7 s on an idle machine), or while it boots on
    # a loaded one; either way the decode rank is named.
    done, cell = _run(tmp_path, {"DSPARK_SIM_DECODE_FAULTS": "rank_exit=0:5"})
    assert done.returncode != 0 and cell["status"] in ("error", "failed")
    assert "decode rank 0 exited" in cell["error"], cell["error"]
    assert "rank_exit" in (cell.get("sglang_error") or "")


def test_a_role_failure_is_named_by_its_role_and_rank_within_the_role():
    from dspark_ci.launchers.contract import LaunchFailed
    from dspark_ci.launchers.pd.pd_group import as_role, blamed
    plan = plan_pd(_cell(TWO_EACH))
    second_decode = plan.of("decode")[1]
    own = as_role(LaunchFailed(cell_id="x-decode1", reason="exited", node_rank=0, rank_exit_code=-9,
                               sglang_error="RuntimeError: boom"), second_decode, "cell")
    lost = as_role(LaunchFailed(cell_id="x-prefill0", reason="exited", node_rank=0, rank_exit_code=1,
                                sglang_error="RuntimeError: NCCL communicator was aborted: node rank 1 disconnected"),
                   plan.of("prefill")[0], "cell")
    assert str(blamed([lost, own])).startswith("cell: decode rank 1 exited with code -9")


def test_the_nightly_plan_and_shards_place_a_pd_cell_on_all_its_nodes(tmp_path):
    plan = subprocess.run([sys.executable, "-m", "dspark_ci", "plan", PD, "--format", "github"], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert plan.returncode == 0, plan.stderr
    entries = json.loads(plan.stdout)["include"]
    two = next(e for e in entries if e["cell"] == TWO_EACH)
    assert two["runner"] == "4x8-gpu-h200" and two["nnodes"] == 4
    assert two["roles"] == {"prefill": {"runner": "8-gpu-h200", "count": 2},
                            "decode": {"runner": "8-gpu-h200", "count": 2}}
    (tmp_path / "plan.json").write_text(plan.stdout)
    shards = subprocess.run([sys.executable, "-m", "dspark_ci.ci.nightly.shards", str(tmp_path / "plan.json")],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert shards.returncode == 0, shards.stderr
    outputs = dict(line.split("=", 1) for line in shards.stdout.splitlines())
    placed = {s["runner"]: s for s in json.loads(outputs["matrix"])["include"]}
    assert TWO_EACH in placed["4x8-gpu-h200"]["cells"].split()
    assert placed["4x8-gpu-h200"]["est_minutes"] > placed["2x8-gpu-h200"]["est_minutes"]  # more nodes, longer boot


def test_k8s_plan_has_a_leaderworkerset_per_role_instance_and_the_router():
    import yaml
    done = subprocess.run([sys.executable, "-m", "dspark_ci", "plan", PD, "--select", f"*{TWO_EACH[-20:]}",
                           "--format", "k8s"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    objects = list(yaml.safe_load_all(done.stdout))
    assert [o["kind"] for o in objects].count("LeaderWorkerSet") == 4
    [router] = [o for o in objects if o["kind"] == "Deployment"]
    argv = router["spec"]["template"]["spec"]["containers"][0]["command"]
    leaders = {o["metadata"]["name"] for o in objects if o["kind"] == "Service" and o["metadata"]["name"].endswith("-leader")}
    urls = [argv[i + 1] for i, a in enumerate(argv) if a in ("--prefill", "--decode")]
    assert len(urls) == 4 and {u.split("//")[1].split(":")[0] for u in urls} == leaders
    assert argv[argv.index("--prefill") + 2] == "8998"  # each prefill URL followed by its bootstrap port
    # the router hands decode the prefill's Service as bootstrap host: that Service must forward the bootstrap port
    first_prefill = argv[argv.index("--prefill") + 1].split("//")[1].split(":")[0]
    service = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == first_prefill)
    assert {"name": "bootstrap", "port": 8998, "targetPort": 8998, "protocol": "TCP"} in service["spec"]["ports"]
    assert "&id" not in done.stdout  # plain YAML, no anchors


def _require(variable: str, required: str, what: str) -> None:
    if not os.environ.get(variable):
        if os.environ.get(required) == "1":
            pytest.fail(f"{variable} is not set ({required}=1): {what}")
        pytest.skip(f"{variable} is not set: {what}")


@needs_router
def test_run_pd_cell_through_docker_puts_the_roles_on_two_engines(tmp_path):
    _require("DSPARK_DOCKER_HOSTS", "DSPARK_REQUIRE_DOCKER", "an inventory of two Docker engines (.ci/run)")
    tag = uuid.uuid4().hex
    done = subprocess.run([sys.executable, "-m", "dspark_ci", "run", PD, "--cell", ONE_EACH, "--launcher", "docker",
                           "--out", str(tmp_path / "run")], env={**os.environ, "CI": "true", "DSPARK_TEST_RUN": tag},
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ledger = [json.loads(line) for line in (tmp_path / "run" / "launched.jsonl").read_text().splitlines()]
    engines = {e["cell"].rsplit("-", 1)[1]: e["engine"] for e in ledger if e.get("launcher") == "docker"
               and e["cell"].endswith(("-prefill0", "-decode0"))}
    assert len(set(engines.values())) == 2, engines  # prefill and decode each on its own engine


@needs_router
def test_run_pd_cell_through_slurm(tmp_path):
    _require("SLURM_CONF", "DSPARK_REQUIRE_SLURM", "a Slurm cluster (.ci/run starts one)")
    done = subprocess.run([sys.executable, "-m", "dspark_ci", "run", PD, "--cell", ONE_EACH, "--launcher", "slurm",
                           "--out", str(tmp_path / "run")], env={**os.environ, "CI": "true"},
                          capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cell = json.loads((tmp_path / "run" / "results.json").read_text())["cells"][0]
    assert _gate(cell)["verdict"] == "passed"
    logs = tmp_path / "run" / "logs" / ONE_EACH
    assert list((logs / "prefill-0").glob("slurm-*.out")) and list((logs / "decode-0").glob("slurm-*.out"))
