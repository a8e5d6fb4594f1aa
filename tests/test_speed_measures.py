"""The speed suite's definitions, as a user reads them in its output: ITL per chunk and per token (and which one
bench_serving would print as ITL), the spread SGLang prints, and what the client itself added.

Each runs `pytest suites/test_speed.py --base-url URL` against a simulator started by hand. Timings are
asserted only within generous bands (the machine is shared); the relations between definitions are exact.
"""

from __future__ import annotations

import pytest

from tests.simulator_process import SPECULATIVE_ARGS, running_simulator
from tests.suite_runs import run_suite

ALPHA, GAMMA = 0.7, 3  # the speculative simulator's acceptance probability and DSpark block size
STEP_MS = 20.0
PREFILL_MS_PER_TOKEN = 0.5


def speed_options(**options) -> list[str]:
    settings = {"num_requests": 12, "concurrency": 6, "output_len": 40, "input_len": 200, "warmup_requests": 2,
                **options}
    return [arg for name, value in settings.items() for arg in ("--suite-option", f"speed.{name}={value}")]


def run_speed(tmp_path, speculative: bool, **options) -> dict:
    env = {"DSPARK_SIM_ACCEPT_PROB": str(ALPHA), "DSPARK_SIM_DECODE_STEP_MS": str(STEP_MS),
           "DSPARK_SIM_PREFILL_MS_PER_TOKEN": str(PREFILL_MS_PER_TOKEN)}
    with running_simulator(env, SPECULATIVE_ARGS if speculative else (), log_path=tmp_path / "sim.log") as url:
        code, output, log = run_suite(tmp_path, "speed", url, *speed_options(**options))
    assert code == 0, log
    return output


def test_under_speculation_itl_per_chunk_and_per_token_differ_by_the_accept_length(tmp_path):
    output = run_speed(tmp_path, speculative=True)
    metrics, records = output["metrics"], output["records"]["speed"]
    # A chunk is one verify step (the step time); a token is a share of it.
    assert 0.7 * STEP_MS <= metrics["itl_chunk_ms_mean"] <= 1.5 * STEP_MS
    tokens_after_first = sum(r["completion_tokens"] - 1 for r in records)
    chunks_after_first = sum(r["itl_count"] for r in records)
    tokens_per_chunk = tokens_after_first / chunks_after_first
    assert 1.5 < tokens_per_chunk <= GAMMA + 1  # several tokens per chunk, each counted from per-chunk usage
    # Per token = Σ gaps / Σ tokens; per chunk = Σ gaps / Σ chunks: their ratio is the tokens per chunk.
    assert metrics["itl_chunk_ms_mean"] / metrics["itl_token_ms_mean"] == pytest.approx(tokens_per_chunk, rel=1e-6)
    # The pinned release's bench_serving prints per-token ITL when /server_info reports an accept length: so do we,
    # as itl_ms_*.
    assert metrics["itl_ms_mean"] == metrics["itl_token_ms_mean"]
    assert metrics["itl_ms_p99"] == metrics["itl_token_ms_p99"]
    [summary] = output["records"]["speed_summary"]
    assert summary["itl_ms_definition"].startswith("per token")


def test_without_speculation_every_chunk_is_one_token_and_the_definitions_agree(tmp_path):
    metrics = run_speed(tmp_path, speculative=False)["metrics"]
    for stat in ("mean", "median", "p90", "p99"):
        assert metrics[f"itl_chunk_ms_{stat}"] == pytest.approx(metrics[f"itl_token_ms_{stat}"])
        assert metrics[f"itl_ms_{stat}"] == metrics[f"itl_chunk_ms_{stat}"]


def test_spread_is_reported_as_bench_serving_prints_it(tmp_path):
    metrics = run_speed(tmp_path, speculative=True)["metrics"]
    for quantity in ("ttft", "tpot", "itl", "itl_chunk", "itl_token"):
        values = [metrics[f"{quantity}_ms_{stat}"] for stat in ("median", "p90", "p99")]
        assert values == sorted(values), quantity


def test_the_timed_window_opens_no_connection_and_the_client_overhead_is_shown(tmp_path):
    output = run_speed(tmp_path, speculative=True, concurrency=24, num_requests=48)
    [summary] = output["records"]["speed_summary"]
    # The pool holds a connection per stream before the window: none is opened (and timed) inside it.
    assert summary["connections"]["opened_in_window"] == 0
    assert summary["connections"]["warmed"] >= 24 - 2  # the warm-up's own connections are reused
    metrics = output["metrics"]
    # The response headers come before the prefill ends: TTFB is the client's send and the server's read.
    assert 0 < metrics["client_ttfb_ms_median"] < metrics["ttft_ms_median"]
    assert metrics["client_loop_lag_ms_p99"] >= 0
