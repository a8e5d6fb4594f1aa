"""How faithfully the speed suite measures: its TPOT and TTFT beside the server's own, request by request.

    python bench/speed_fidelity.py [--clients aiohttp openai] [--workers 1 2] [--repeats 3] [--quick]

Starts the simulator locally without speculation (every decode step emits exactly one token) and with
DSPARK_SIM_EMISSION_LOG, which records per request when the simulator parsed it, handed out its first
token and its last, on time.monotonic(). Then it runs the speed suite's own measurement code
(suites/speed.py) at concurrency 1, 64 and 256, matches each measured request to its log line by the
stream's id, and prints, from that one run:
    TPOT ours / server's     server TPOT = (last − first) / (completion tokens − 1)
    TTFT ours / server's     server TTFT = first − arrival
    TTFT excess = ours − server's = (arrival − our send) + (our first chunk − server's first token)
and the server's own lateness against the configured step and prefill times. A traced aiohttp run of
the same shape (bench/send_trace.py) then splits "before the server saw the request" into the
client's sending and the server's reading. Finally, at concurrency 256, it shortens the step and
prints the highest aggregate stream rate (tokens/s) at which our mean TPOT is still within 1 % of
the server's. Client and simulator share the machine's cores. About 8 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.send_trace import SendTrace, trace_sends  # noqa: E402
from bench.server_truth import PairedRequest, pair_with_server  # noqa: E402
from suites.server import Server  # noqa: E402
from tests.simulator_process import running_simulator  # noqa: E402
from suites.speed import SpeedSettings, build_prompts, calibrate, percentile, run_measurement  # noqa: E402

CONCURRENCIES = (1, 64, 256)
TRACED_CONCURRENCIES = (64, 256)
SWEEP_CONCURRENCY = 256
RATE_SWEEP_STEP_MS = (40.0, 20.0, 10.0, 5.0, 2.5)
WITHIN = 0.01


@dataclass(frozen=True)
class Simulator:
    """A running simulator and what it was told to do."""

    url: str
    emission_log: Path
    step_ms: float
    prefill_ms_per_token: float


@dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int


@dataclass(frozen=True)
class Fidelity:
    """One measurement: ratios are ours / the server's, per request, then summarised."""

    client: str
    concurrency: int
    workers: int
    step_ms: float
    requests: int
    tpot_ratio_mean: float
    tpot_ratio_p99: float
    server_tpot_vs_step: float  # mean server TPOT / configured step: the simulator's own lateness
    ttft_ratio_median: float
    ttft_ratio_p99: float
    server_ttft_ms_median: float
    server_ttft_vs_configured: float  # median server TTFT / (prompt tokens × prefill ms per token)
    ttft_excess_ms_mean: float  # = before_server_ms_mean + after_first_token_ms_mean
    ttft_excess_ms_p99: float
    before_server_ms_mean: float  # our send → the server parsed it
    before_server_ms_p99: float
    before_server_ms_first_wave: float  # mean over the first `concurrency` requests sent: all at once
    before_server_ms_later: float  # mean over the rest: each sent as an earlier one ends
    after_first_token_ms_mean: float  # the server's first token → our first chunk
    after_first_token_ms_p99: float
    stream_rate_tok_s: float  # Σ tokens / wall time
    loop_lag_ms_p99: float
    client_cpu_cores: float  # CPU seconds of the client (this process and its finished workers) / wall


def measure(sim: Simulator, workload: Workload, client: str, concurrency: int, workers: int) -> Fidelity:
    server = Server(base_url=sim.url, model="sim/model", api_key="EMPTY", request_timeout=600)
    requests = max(8, 2 * concurrency)
    settings = SpeedSettings(num_requests=requests, concurrency=concurrency, input_len=workload.input_len,
                             output_len=workload.output_len, warmup_requests=min(concurrency, 16),
                             workers=workers, ignore_eos=True, client=client)
    overhead, per_word = calibrate(server)
    prompts = build_prompts(requests, workload.input_len, overhead, per_word, seed=1)
    warmup = build_prompts(settings.warmup_requests, workload.input_len, overhead, per_word, seed=2)
    cpu_before, wall_before = client_cpu_seconds(), time.monotonic()
    results = run_measurement(server, settings, prompts, warmup)
    cpu_cores = (client_cpu_seconds() - cpu_before) / (time.monotonic() - wall_before)
    timings = [t for result in results for t in result.timings if t.ok]
    if len(timings) < requests:
        raise SystemExit(f"{requests - len(timings)} requests failed at concurrency {concurrency}")
    paired = pair_with_server(timings, sim.emission_log)
    lag = [value for result in results for value in result.loop_lag_ms]
    return Fidelity(client=client, concurrency=concurrency, workers=workers, step_ms=sim.step_ms, requests=requests,
                    **server_comparison(paired, sim, concurrency), **client_load(paired, lag, cpu_cores))


def server_comparison(paired: Sequence[PairedRequest], sim: Simulator, concurrency: int) -> dict[str, float]:
    in_send_order = sorted(paired, key=lambda p: p.client.start)
    first_wave, later = in_send_order[:concurrency], in_send_order[concurrency:]
    tpot_ratios = [p.client.tpot / p.server.tpot for p in paired]
    ttft_ratios = [p.client.ttft / p.server.ttft for p in paired]
    excess_ms = [p.ttft_excess_s * 1000 for p in paired]
    before_ms = [p.before_server_s * 1000 for p in paired]
    after_ms = [p.after_first_token_s * 1000 for p in paired]
    server_ttft_ms = [p.server.ttft * 1000 for p in paired]
    configured_ttft_ms = [p.client.prompt_tokens * sim.prefill_ms_per_token for p in paired]
    return dict(
        tpot_ratio_mean=statistics.fmean(tpot_ratios), tpot_ratio_p99=percentile(tpot_ratios, 99),
        server_tpot_vs_step=statistics.fmean(p.server.tpot * 1000 for p in paired) / sim.step_ms,
        ttft_ratio_median=statistics.median(ttft_ratios), ttft_ratio_p99=percentile(ttft_ratios, 99),
        server_ttft_ms_median=statistics.median(server_ttft_ms),
        server_ttft_vs_configured=statistics.median(s / c for s, c in zip(server_ttft_ms, configured_ttft_ms)),
        ttft_excess_ms_mean=statistics.fmean(excess_ms), ttft_excess_ms_p99=percentile(excess_ms, 99),
        before_server_ms_mean=statistics.fmean(before_ms), before_server_ms_p99=percentile(before_ms, 99),
        before_server_ms_first_wave=statistics.fmean(p.before_server_s * 1000 for p in first_wave),
        before_server_ms_later=statistics.fmean(p.before_server_s * 1000 for p in later),
        after_first_token_ms_mean=statistics.fmean(after_ms), after_first_token_ms_p99=percentile(after_ms, 99),
    )


def client_load(paired: Sequence[PairedRequest], lag_ms: Sequence[float], cpu_cores: float) -> dict[str, float]:
    timings = [p.client for p in paired]
    wall = max(t.start + t.e2e for t in timings) - min(t.start for t in timings)
    return dict(stream_rate_tok_s=sum(t.completion_tokens for t in timings) / wall,
                loop_lag_ms_p99=percentile(lag_ms, 99) if lag_ms else 0.0, client_cpu_cores=cpu_cores)


def client_cpu_seconds() -> float:
    # RUSAGE_CHILDREN counts only children that have exited and been waited for: the speed workers,
    # not the simulator, which runs until after the measurement.
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure_median(repeats: int, *args) -> Fidelity:
    """The repeat with the median TPOT ratio (with --repeats > 1, for a noisy machine)."""
    started = time.monotonic()
    rows = sorted((measure(*args) for _ in range(repeats)), key=lambda row: row.tpot_ratio_mean)
    row = rows[len(rows) // 2]
    print(f"  measured {row.client} conc {row.concurrency} workers {row.workers} step {row.step_ms:g} ms "
          f"in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return row


@contextlib.contextmanager
def simulator(step_ms: float, prefill_ms_per_token: float) -> Iterator[Simulator]:
    with tempfile.TemporaryDirectory(prefix="speed-fidelity-") as scratch:
        log = Path(scratch) / "emissions.jsonl"
        env = {"DSPARK_SIM_DECODE_STEP_MS": str(step_ms),
               "DSPARK_SIM_PREFILL_MS_PER_TOKEN": str(prefill_ms_per_token), "DSPARK_SIM_EMISSION_LOG": str(log)}
        with running_simulator(env) as url:
            yield Simulator(url, log, step_ms, prefill_ms_per_token)


# ---------------------------------------------------------------- tables

Column = tuple[str, Callable[[Any], str]]  # header, cell of a row

SETUP_COLUMNS: list[Column] = [
    ("client", lambda r: r.client), ("conc", lambda r: str(r.concurrency)), ("workers", lambda r: str(r.workers)),
    ("step ms", lambda r: f"{r.step_ms:g}"), ("requests", lambda r: str(r.requests)),
]
TPOT_COLUMNS: list[Column] = [
    ("TPOT ours/server mean", lambda r: f"{r.tpot_ratio_mean:.3f}"),
    ("TPOT ours/server p99", lambda r: f"{r.tpot_ratio_p99:.3f}"),
    ("server TPOT / step", lambda r: f"{r.server_tpot_vs_step:.3f}"),
]
TTFT_COLUMNS: list[Column] = [
    ("TTFT ours/server median", lambda r: f"{r.ttft_ratio_median:.3f}"),
    ("TTFT ours/server p99", lambda r: f"{r.ttft_ratio_p99:.3f}"),
    ("server TTFT ms median", lambda r: f"{r.server_ttft_ms_median:.1f}"),
    ("server TTFT / configured", lambda r: f"{r.server_ttft_vs_configured:.3f}"),
    ("excess ms mean = before server + after first token", lambda r: (
        f"{r.ttft_excess_ms_mean:.1f} = {r.before_server_ms_mean:.1f} + {r.after_first_token_ms_mean:.1f}")),
    ("p99 ms: excess / before / after", lambda r: (
        f"{r.ttft_excess_ms_p99:.1f} / {r.before_server_ms_p99:.1f} / {r.after_first_token_ms_p99:.1f}")),
    ("before server ms mean: first wave / later", lambda r: (
        f"{r.before_server_ms_first_wave:.1f} / {r.before_server_ms_later:.1f}")),
]
LOAD_COLUMNS: list[Column] = [
    ("stream tok/s", lambda r: f"{r.stream_rate_tok_s:.0f}"),
    ("client loop lag p99 ms", lambda r: f"{r.loop_lag_ms_p99:.1f}"),
    ("client CPU cores", lambda r: f"{r.client_cpu_cores:.2f}"),
]
SEND_TRACE_COLUMNS: list[Column] = [
    ("conc", lambda t: str(t.concurrency)),
    ("first wave ms: client (send → body written) + server (body written → parsed)", lambda t: (
        f"{t.client_ms_first_wave:.1f} + {t.server_ms_first_wave:.1f}")),
    ("later ms: client + server", lambda t: f"{t.client_ms_later:.1f} + {t.server_ms_later:.1f}"),
    ("server's arrival spacing in the first wave, ms", lambda t: f"{t.arrival_spacing_ms:.2f}"),
]
SWEEP_COLUMNS: list[Column] = [
    *SETUP_COLUMNS, *TPOT_COLUMNS, TTFT_COLUMNS[0], TTFT_COLUMNS[4], *LOAD_COLUMNS,
]


def markdown_table(columns: Sequence[Column], rows: Sequence[Any]) -> str:
    lines = ["| " + " | ".join(header for header, _ in columns) + " |",
             "|---|" + "---:|" * (len(columns) - 1)]
    lines += ["| " + " | ".join(cell(row) for _, cell in columns) + " |" for row in rows]
    return "\n".join(lines)


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    return (f"nproc={os.cpu_count()}, CPU: {cpu}, Python {platform.python_version()}, {platform.system()} "
            f"{platform.release()}")


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


# ---------------------------------------------------------------- runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--prefill-ms-per-token", type=float, default=0.5)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--clients", nargs="+", default=["aiohttp", "openai"], choices=["aiohttp", "openai"])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sweep-clients", nargs="+", default=["aiohttp"], choices=["aiohttp", "openai"],
                        help="clients in the stream-rate sweep (openai is far below aiohttp's ceiling)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per row; the median one is printed")
    parser.add_argument("--quick", action="store_true", help="skip the stream-rate sweep")
    args = parser.parse_args()
    workload = Workload(input_len=args.input_len, output_len=args.output_len)
    started = time.monotonic()
    print(f"machine: {machine()}\nload average at start: {load_average()}\n")
    rows = concurrency_rows(args, workload)
    print(f"TPOT, step {args.step_ms:g} ms:\n\n"
          f"{markdown_table([*SETUP_COLUMNS, *TPOT_COLUMNS, *LOAD_COLUMNS], rows)}\n")
    print(f"TTFT, prefill {args.prefill_ms_per_token:g} ms/token:\n\n"
          f"{markdown_table([*SETUP_COLUMNS, *TTFT_COLUMNS], rows)}\n", flush=True)
    print("before the server saw the request, in a traced aiohttp run of the same shape (bench/send_trace.py):\n\n"
          f"{markdown_table(SEND_TRACE_COLUMNS, send_traces(args, workload))}\n", flush=True)
    if not args.quick:
        sweep(args, workload)
    print(f"\nload average at end: {load_average()}; whole run {time.monotonic() - started:.0f} s")


def concurrency_rows(args, workload: Workload) -> list[Fidelity]:
    with simulator(args.step_ms, args.prefill_ms_per_token) as sim:
        return [measure_median(args.repeats, sim, workload, client, concurrency, workers)
                for client in args.clients for workers in args.workers for concurrency in CONCURRENCIES]


def send_traces(args, workload: Workload) -> list[SendTrace]:
    with simulator(args.step_ms, args.prefill_ms_per_token) as sim:
        return [trace_sends(sim.url, sim.emission_log, concurrency, workload.input_len, workload.output_len,
                            args.repeats)
                for concurrency in TRACED_CONCURRENCIES]


def sweep(args, workload: Workload) -> None:
    rows_by_setup: dict[tuple[str, int], list[Fidelity]] = {}
    for client in args.sweep_clients:
        for workers in args.workers:
            rows_by_setup[client, workers] = list(sweep_steps(args, workload, client, workers))
    rows = [row for setup_rows in rows_by_setup.values() for row in setup_rows]
    print(f"stream-rate sweep at concurrency {SWEEP_CONCURRENCY} (shorter steps = more tokens/s):\n\n"
          f"{markdown_table(SWEEP_COLUMNS, rows)}\n")
    for (client, workers), setup_rows in rows_by_setup.items():
        within = [row for row in setup_rows if abs(row.tpot_ratio_mean - 1) <= WITHIN]
        best = max(within, key=lambda row: row.stream_rate_tok_s, default=None)
        rate = f"{best.stream_rate_tok_s:.0f} tok/s (step {best.step_ms:g} ms)" if best else "none of the steps tried"
        print(f"client={client} workers={workers}: highest aggregate stream rate with mean TPOT within "
              f"{WITHIN:.0%} of the server's: {rate}")


def sweep_steps(args, workload: Workload, client: str, workers: int) -> Iterator[Fidelity]:
    for step_ms in RATE_SWEEP_STEP_MS:
        with simulator(step_ms, args.prefill_ms_per_token) as sim:
            yield measure_median(args.repeats, sim, workload, client, SWEEP_CONCURRENCY, workers)


if __name__ == "__main__":
    main()
