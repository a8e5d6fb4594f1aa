"""Streaming speed: ttft_ms_*, tpot_ms_*, itl_ms_* (bench_serving's ITL), itl_chunk_ms_*, itl_token_ms_*,
e2e_latency_s_mean, output_throughput_tok_s, input_tokens_mean, output_tokens_mean, and the client's own
overhead client_loop_lag_ms_p99, client_ttfb_ms_*; with --server-pid (the launcher's, suites/offcpu.py) where the
server's scheduler spent the window per output token: scheduler_blocked_ms_per_token (no thread of it runnable: a
sleep, a lock, a sync), scheduler_cpu_ms_per_token, scheduler_runqueue_ms_per_token; records "speed"
(per request) and "speed_summary". With --reference-url (the deployment without speculation) also
speculative_speedup (its median TPOT / ours, the same requests sent to both in speedup_rounds alternating rounds)
and speculative_speedup_stderr, records "speed_reference" and "speedup_rounds". With
--role-url (a disaggregated deployment's servers behind the router) also ttft_prefill_queue_ms, ttft_transfer_ms,
ttft_first_decode_ms, as far as the servers report their stages (suites/ttft_split.py; a warning names each one
they do not).

Options (suite "speed"): num_requests, concurrency, input_len, output_len, warmup_requests, workers, ignore_eos,
speedup_rounds; sweep_concurrency, sweep_input_len, sweep_min_requests, sweep_output_len: with a reference and a
non-empty sweep_concurrency, the speedup at every point of the grid and speculation_boundary_concurrency (the
concurrency where it falls to 1 at the shortest sweep input length), record "speed_envelope" (suites/envelope.py).
Speed is gated by the run against a baseline; this suite fails only when requests fail.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest
from dspark_ci.ground.suites import SATURATED_LOOP_LAG_MS
from dspark_ci.suites import offcpu
from dspark_ci.suites.envelope import alternating_speedup, envelope_record, sweep
from dspark_ci.suites.server import connect
from dspark_ci.suites.speed import (
    SpeedSettings,
    WorkerResult,
    build_prompts,
    calibrate,
    client_overhead_metrics,
    percentile,
    run_measurement,
    server_reports_accept_length,
    speed_metrics,
    timing_record,
)
from dspark_ci.suites.ttft_split import read_roles, ttft_split


@pytest.fixture(scope="module")
def speed_run(server, suite_config, suite_output):
    settings = SpeedSettings.from_options(suite_config.suite("speed"))
    overhead, tokens_per_word = calibrate(server)
    prompts = build_prompts(settings.num_requests, settings.input_len, overhead, tokens_per_word, seed=1)
    warmup = build_prompts(settings.warmup_requests, settings.input_len, overhead, tokens_per_word, seed=2)
    schedulers = offcpu.scheduler_pids(suite_config.server_pids)
    results = run_measurement(server, settings, prompts, warmup, suite_config.roles, schedulers)
    stage_means_ms = _ttft_split(suite_config, results, suite_output)
    timings = [timing for result in results for timing in result.timings]
    lag = [value for result in results for value in result.loop_lag_ms]

    per_token_itl = server_reports_accept_length(server)
    share = _scheduler_share(results, timings)
    suite_output.add_metrics({**speed_metrics(timings, per_token_itl), **client_overhead_metrics(results),
                              **(share.metrics() if share else {})})
    suite_output.add_records("speed", [timing_record(t) for t in timings])
    lag_p99 = percentile(lag, 99) if lag else None
    suite_output.add_records("speed_summary", [{
        "settings": vars(settings), "model": server.model,
        "prompt_calibration": {"overhead_tokens": overhead, "tokens_per_word": tokens_per_word},
        "failed": sum(not t.ok for t in timings),
        "itl_ms_definition": _itl_definition(per_token_itl, timings),
        "client_loop_lag_ms": {"median": statistics.median(lag), "p99": lag_p99} if lag else None,
        "connections": {"warmed": _total(r.connections_warmed for r in results),
                        "opened_in_window": _total(r.connections_opened_in_window for r in results)},
        "stage_means_ms": stage_means_ms,
        "scheduler_time": _scheduler_record(share, schedulers, suite_config.server_pids),
    }])
    if lag_p99 is not None and lag_p99 > SATURATED_LOOP_LAG_MS:
        suite_output.warn(f"speed: the client's event loop ran {lag_p99:.1f} ms late (p99): the machine was short of "
                          f"CPU, so these timings are its, not the server's (the gates set them aside); free the "
                          f"machine or raise speed.workers (BENCHMARKS.md)")
    _warn_on_short_outputs(timings, settings, suite_output)
    if suite_config.reference_url is not None:
        _speculation_pays(server, suite_config, settings, prompts, warmup, suite_output)
        _envelope(server, suite_config, settings, overhead, tokens_per_word, suite_output)
    return timings


def _scheduler_share(results: list[WorkerResult], timings) -> offcpu.WindowShare | None:
    """Where the least-blocked scheduler spent the window, per output token of the window (suites/offcpu.py)."""
    reader = next((r for r in results if r.schedulers_at_window), None)
    if reader is None:
        return None
    tokens = sum(t.completion_tokens for t in timings if t.ok)
    return offcpu.window_share(reader.schedulers_at_window, reader.schedulers_after_window, reader.scheduler_stalls,
                               tokens)


def _scheduler_record(share, schedulers, server_pids) -> dict:
    if share is not None:
        return {**vars(share), "schedulers": list(schedulers)}
    why = ("not measured: only the launcher knows the server's processes (--server-pid, given by `dspark-ci run` "
           "with the local launcher)" if not server_pids else "not measured: no scheduler process could be read")
    return {"note": why, "schedulers": list(schedulers)}


def _ttft_split(suite_config, results: list[WorkerResult], suite_output) -> dict[str, float] | None:
    """A disaggregated deployment's TTFT split over the window (suites/ttft_split.py), read from its servers right
    after the window; the stage means behind it (None without --role-url)."""
    before = next((r.roles_at_window for r in results if r.roles_at_window is not None), None)
    if before is None:
        return None
    split = ttft_split(before, read_roles(suite_config.roles))
    suite_output.add_metrics(split.metrics)
    for note in split.not_reported:
        suite_output.warn(f"speed: {note}")
    return split.stage_means_ms


def _envelope(server, suite_config, settings, overhead, tokens_per_word, suite_output) -> None:
    """Where speculation pays (suites/envelope.py), when the cell asks for a sweep (speed.sweep_concurrency)."""
    options = suite_config.suite("speed")
    if not options["sweep_concurrency"]:
        return
    reference = connect(replace(suite_config, base_url=suite_config.reference_url, model=None))
    points = sweep(server, reference, settings, options["sweep_concurrency"], options["sweep_input_len"],
                   options["sweep_min_requests"], options["sweep_output_len"], overhead, tokens_per_word)
    record = envelope_record(points)
    suite_output.add_records("speed_envelope", [record])
    shortest = record["boundaries"][str(min(options["sweep_input_len"]))]
    suite_output.add_metrics({"speculation_boundary_concurrency": shortest["concurrency"]})


def _speculation_pays(server, suite_config, settings, prompts, warmup, suite_output) -> None:
    """With the same deployment without speculation beside it (--reference-url, which the run passes when it
    launched that reference), the same requests against both in alternating rounds (suites/envelope.py):
    speculative_speedup = its median TPOT / ours. Acceptance can stay flat while the speedup vanishes; this is the
    number that says whether speculation pays."""
    reference = connect(replace(suite_config, base_url=suite_config.reference_url, model=None))
    measured = alternating_speedup(server, reference, settings, prompts, warmup,
                                   suite_config.suite("speed")["speedup_rounds"])
    suite_output.add_metrics(measured.metrics())
    suite_output.add_records("speed_reference", [timing_record(t) for t in measured.theirs])
    suite_output.add_records("speedup_rounds", [{"ours_tpot_ms_median": ours, "reference_tpot_ms_median": theirs}
                                                for ours, theirs in measured.rounds])


def _itl_definition(per_token_itl: bool, timings) -> str:
    if not per_token_itl:
        return "per chunk (the server reports no accept length, as bench_serving decides)"
    if any(t.ok and t.itl_tokens is None for t in timings):
        return "per chunk (the server speculates but sent no per-chunk usage to count each chunk's tokens)"
    return "per token (the server reports an accept length, as bench_serving decides)"


def _total(values) -> int | None:
    values = list(values)
    return None if None in values else sum(values)


def _warn_on_short_outputs(timings, settings, suite_output) -> None:
    short = [t for t in timings if t.ok and t.completion_tokens < settings.output_len]
    if short and settings.ignore_eos:
        suite_output.warn(f"speed: {len(short)} of {len(timings)} requests stopped before output_len="
                          f"{settings.output_len} tokens although ignore_eos was sent")


def test_speed(speed_run):
    failed = [t for t in speed_run if not t.ok]
    assert not failed, f"{len(failed)} of {len(speed_run)} streamed requests failed; first: {failed[0].error}"
