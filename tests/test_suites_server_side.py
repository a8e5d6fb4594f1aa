"""Suite behaviour the simulator does not exercise, against small stand-in servers on loopback:
accept's server-side cross-check over several DP ranks and against a /metrics that miscounts, and GPQA's
download-once dataset cache.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import threading
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiohttp import web

from tests.simulator_process import free_port, running_simulator
from tests.suite_runs import SYNTHETIC_GPQA, run_suite

# Per DP rank: (completion tokens, verify steps) of every request it serves. Step tokens per verify:
# rank 0: 100/40 = 2.5, rank 1: 60/30 = 2.0; over the window (weighted by tokens): 160/70.
RANK_WORK = {0: (101, 40), 1: (61, 30)}


def stand_in_sglang(rank_accept_after: dict[int, float],
                    verify_calls_counted: float | None = None) -> web.Application:
    """Two DP ranks; chat responses carry sglext spec details and meta_info.dp_rank, alternating ranks;
    /server_info reports nothing before the first request and ``rank_accept_after`` afterwards. With
    ``verify_calls_counted``, /metrics is served as by a fresh SGLang (no counter before the first request)
    and counts that many verify calls per verify step the responses report (1.0: right)."""
    served = {"count": 0, "tokens": 0, "verify": 0}

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "stand-in", "object": "model"}]})

    async def chat(request):
        rank = served["count"] % 2
        tokens, verify = RANK_WORK[rank]
        served["count"] += 1
        served["tokens"] += tokens
        served["verify"] += verify
        details = {"spec_verify_ct": verify, "spec_num_correct_drafts": tokens - 1 - verify,
                   "spec_num_proposed_drafts": 3 * verify, "spec_accept_length": tokens / verify}
        return web.json_response({
            "id": "x", "object": "chat.completion", "created": 0, "model": "stand-in",
            "choices": [{"index": 0, "finish_reason": "length",
                         "message": {"role": "assistant", "content": "text"},
                         "meta_info": {"dp_rank": rank, "completion_tokens": tokens, **details}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": tokens, "total_tokens": tokens + 10},
            "sglext": {"spec_tokens_details": details}})

    async def server_info(request):
        states = [{"dp_rank": rank} | ({"avg_spec_accept_length": rank_accept_after[rank]} if served["count"] else {})
                  for rank in RANK_WORK]
        return web.json_response({"speculative_algorithm": "DSPARK", "internal_states": states})

    async def metrics(request):
        text = "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0.0\n"
        if served["count"]:  # labelled counters appear once a request has moved them
            text += (f"# TYPE sglang:generation_tokens_total counter\n"
                     f"sglang:generation_tokens_total{{is_streaming=\"false\"}} {served['tokens']}\n"
                     f"# TYPE sglang:spec_verify_calls_total counter\n"
                     f"sglang:spec_verify_calls_total {served['verify'] * verify_calls_counted}\n")
        return web.Response(text=text)

    app = web.Application()
    app.add_routes([web.get("/v1/models", models), web.post("/v1/chat/completions", chat),
                    web.get("/server_info", server_info)])
    if verify_calls_counted is not None:
        app.add_routes([web.get("/metrics", metrics)])
    return app


def failed_test(output: dict) -> str:
    [failed] = [test["nodeid"] for test in output["tests"] if test["outcome"] == "failed"]
    return failed


@contextmanager
def serving(app: web.Application):
    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


@pytest.mark.parametrize("rank_accept_after, warned", [
    ({0: 2.5, 1: 2.0}, False),
    ({0: 2.5, 1: 3.0}, True),
], ids=["ranks-agree", "rank-1-disagrees"])
def test_accept_cross_checks_every_dp_rank_weighted_by_tokens(tmp_path, rank_accept_after, warned):
    with serving(stand_in_sglang(rank_accept_after)) as url:
        code, output, log = run_suite(tmp_path, "accept", url, "--suite-option", "accept.num_requests=4",
                                      "--suite-option", "accept.concurrency=1")
    assert code == (1 if warned else 0), log
    assert output["metrics"]["accept_length"] == pytest.approx((101 + 61) / 70)
    [figure] = output["records"]["accept_server"]
    assert figure["exact_window"] and figure["weighting"] == "tokens per dp_rank"
    expected = (200 + 120) / (200 / rank_accept_after[0] + 120 / rank_accept_after[1])
    assert figure["accept_length"] == pytest.approx(expected)
    assert [r["window_tokens"] for r in figure["ranks"]] == [200, 120]
    [summary] = output["records"]["accept_summary"]
    assert bool(summary["disagreements"]) == warned
    if warned:
        assert "disagrees with /server_info internal_states" in summary["disagreements"][0]
        assert failed_test(output) == "suites/test_accept.py::test_accept_figures_agree_with_the_server"
    assert not summary["metrics_cross_check"]  # the stand-in serves no /metrics
    assert summary["no_metrics_cross_check_because"].startswith("/metrics not served")


@pytest.mark.parametrize("verify_calls_counted, warned", [(1.0, False), (1.5, True)],
                         ids=["counts-right", "miscounts-verify-calls"])
def test_accept_cross_checks_metrics_of_a_fresh_server_counting_from_zero(tmp_path, verify_calls_counted, warned):
    with serving(stand_in_sglang({0: 2.5, 1: 2.0}, verify_calls_counted)) as url:
        code, output, log = run_suite(tmp_path, "accept", url, "--suite-option", "accept.num_requests=4",
                                      "--suite-option", "accept.concurrency=1")
    assert code == (1 if warned else 0), log  # a disagreement fails, on a fresh server as on a warm one
    figure = next(f for f in output["records"]["accept_server"] if f["source"] == "/metrics counters")
    assert figure["window_start"] == "counters absent before the window (fresh server): counted from zero"
    assert (figure["generation_tokens"], figure["verify_calls"]) == (2 * (101 + 61), 2 * 70 * verify_calls_counted)
    assert figure["accept_length"] == pytest.approx((101 + 61) / (70 * verify_calls_counted))
    [summary] = output["records"]["accept_summary"]
    assert summary["metrics_cross_check"] and summary["no_metrics_cross_check_because"] is None
    assert bool(summary["disagreements"]) == warned
    if warned:
        assert "disagrees with /metrics counters" in summary["disagreements"][0]
        assert failed_test(output) == "suites/test_accept.py::test_accept_figures_agree_with_the_server"


def test_gpqa_downloads_a_dataset_url_once_into_the_cache(tmp_path):
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(SYNTHETIC_GPQA.parent))
    files = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=files.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{files.server_address[1]}/{SYNTHETIC_GPQA.name}"
    cache = tmp_path / "cache"
    env = {"DSPARK_SIM_DECODE_STEP_MS": "1", "DSPARK_SIM_GPQA_PATH": str(SYNTHETIC_GPQA)}
    try:
        with running_simulator(env, log_path=tmp_path / "sim.log") as base_url:
            args = ("--gpqa-dataset", url, "--cache-dir", str(cache), "--suite-option", "gpqa.num_questions=3")
            code, first, log = run_suite(tmp_path, "gpqa", base_url, *args)
            assert code == 0, log
            files.shutdown()  # the second run must not need the URL
            code, second, log = run_suite(tmp_path, "gpqa", base_url, *args)
            assert code == 0, log
    finally:
        files.server_close()
    cached = list((cache / "gpqa").iterdir())
    assert len(cached) == 1 and cached[0].read_bytes() == SYNTHETIC_GPQA.read_bytes()
    for output in (first, second):
        dataset = output["records"]["gpqa_summary"][0]["dataset"]
        assert dataset["source"] == url
        assert dataset["sha256"] == hashlib.sha256(SYNTHETIC_GPQA.read_bytes()).hexdigest()
