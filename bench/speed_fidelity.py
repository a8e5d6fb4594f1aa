"""How faithfully the speed suite measures, beside SGLang's own bench_serving and the server's truth.

    python bench/speed_fidelity.py [--repeats 3] [--concurrencies 1 64 256] [--bench-serving PYTHON] [--shards N]

On a DSpark cell of the simulator (speculative: a chunk carries one verify step's accepted tokens), for
each concurrency and each repeat, every tool gets a freshly started simulator with
DSPARK_SIM_EMISSION_LOG (when it parsed each request and handed out each emission, with its token count,
on time.monotonic()) and identical traffic: the same prompts, max tokens and concurrency, 2 × concurrency
measured requests (at least 8). The tools:
    suite           the speed suite's own code (suites/speed.py: warm-up, warmed pool, semaphore, clock)
    suite-openai    the same with speed.client=openai (the official client reads the streams; --tools)
    bench_serving   `python -m sglang.benchmark.serving` of the SGLang release run from its own venv
                    (bench/sglang_bench_serving.py; --bench-serving PYTHON, default $DSPARK_SGLANG_PYTHON)
    suite-frontend  the suite against SGLang's own front end in front of the same engine
                    (--server sglang-frontend; the venv of .ci/sglang-frontend.sh, --bench-serving PYTHON): the
                    truth is still the engine's emissions, so its excess over "suite" is what SGLang's own
                    HTTP server, TokenizerManager, IPC and DetokenizerManager add
The truth is the server's side of the same measured requests (by response id for the suite; the
last-parsed requests for bench_serving, whose warm-up ends before they start):
    TPOT  = (last − first emission) / (completion tokens − 1)      TTFT = first emission − arrival
    ITL per chunk = gaps between emissions; ITL per token = each gap / its tokens, once per token
Two comparisons, never mixed: the simulator against its configured step (its emission gaps / DSPARK_SIM_DECODE_STEP_MS:
does the reference keep its own time?) and each tool against the truth (the server's recorded emission times for
the same requests: does the tool measure what the server did, late steps included?).
Every figure is printed as min / median / max over the kept repeats. A repeat is discarded by rule, not
by hand, when the simulator's own pacing is off: the median or the mean emission gap / configured step by more
than PACING_TOLERANCE, or the p99 gap / step by more than TAIL_TOLERANCE (a repeat whose median stayed on time
while a busy loop stretched the tail is no truth to measure against). The machine was then too busy for
either side to be measured. The load average is
printed before every repeat, and a discarded repeat says which of the three was off. Client and simulator share
the machine's cores. The arrivals are a fixed-concurrency benchmark's, as bench_serving's at --max-concurrency: the
first `concurrency` requests arrive at once, and since every reply has the same length they finish within a few
dozen steps of each other, their successors arriving in that window (a second wave, spread by the acceptance draws);
--timeline prints, per repeat, where the late gaps fall against those arrivals and finishes. The verify step costs the
same at every batch size here (DSPARK_SIM_SPEC_BATCH_COST=0), so the configured step is the gap the simulator owes at
any concurrency. --shards N runs the simulator as N engine processes (DSPARK_SIM_SHARDS, with --dp-size N: each shard
schedules one DP rank) for more streams than one core paces.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dspark_ci.ground.sglang.release import DEFAULT_VERSION
from dspark_ci.suites.server import Server  # noqa: E402
from dspark_ci.suites.speed import (  # noqa: E402
    SpeedSettings,
    build_prompts,
    calibrate,
    client_overhead_metrics,
    percentile,
    run_measurement,
)

from bench.server_truth import ServerTimes, last_arrivals, pair_with_server  # noqa: E402
from tests.simulator_process import SPECULATIVE_ARGS, running_simulator  # noqa: E402

MODEL = "sim/model"
PACING_TOLERANCE = 0.05  # the simulator's steps run ~1-2 % late at one stream on an idle machine
TAIL_TOLERANCE = 0.25  # the p99 gap: one late wake-up in a hundred steps is a quarter step on a loaded core
BENCH_SERVING_WARMUP = 1  # its --warmup-requests default
SUITE_WARMUP_LIMIT = 16  # the suite's warm-up here: min(concurrency, 16) requests, then the pool is opened
# What each table compares: (key, label); every key is computed for a tool and for the truth alike.
QUANTITIES = (("tpot_mean", "TPOT mean"), ("tpot_p99", "TPOT p99"), ("ttft_median", "TTFT median"),
              ("itl_chunk_mean", "ITL per chunk mean"), ("itl_chunk_p99", "ITL per chunk p99"),
              ("itl_token_mean", "ITL per token mean"), ("itl_token_p99", "ITL per token p99"))


@dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int
    step_ms: float
    prefill_ms_per_token: float
    shards: int = 1
    natural_lengths: bool = False  # replies end at the model's EOS (at most output_len): lengths spread


@dataclass(frozen=True)
class Samples:
    """Per-request and per-gap values in ms, from a tool or from the server."""

    tpot: list[float]
    ttft: list[float]
    itl_chunk: list[float]
    itl_token: list[float]

    def stats(self) -> dict[str, float]:
        """``<quantity>_mean``, ``_median``, ``_p99`` of each quantity that has values."""
        stats = {}
        for name in ("tpot", "ttft", "itl_chunk", "itl_token"):
            values = getattr(self, name)
            if values:
                stats.update({f"{name}_mean": statistics.fmean(values), f"{name}_median": statistics.median(values),
                              f"{name}_p99": percentile(values, 99)})
        return stats


@dataclass(frozen=True)
class ToolMeasurement:
    ours: dict[str, float]  # Samples.stats() keys, as the tool computes them
    truth: list[ServerTimes]  # the server's side of the same measured requests
    extra: dict[str, float] = field(default_factory=dict)  # what only this tool can say (TTFT split, client)


@dataclass(frozen=True)
class Repeat:
    """One tool's measurement on its own fresh simulator, beside the server's truth for the same requests."""

    tool: str
    concurrency: int
    ours: dict[str, float]
    truth: dict[str, float]
    pacing: Pacing  # the simulator's emission gaps / configured step
    load_average: float  # 1-minute, before the repeat
    extra: dict[str, float] = field(default_factory=dict)  # tool-specific: the TTFT split, client overhead

    @property
    def kept(self) -> bool:
        return self.pacing.on_time

    @property
    def ttft_excess_ms(self) -> float:
        """Mean TTFT − the server's mean TTFT: the mean per-request excess (a mean needs no pairing)."""
        return self.ours["ttft_mean"] - self.truth["ttft_mean"]


def server_samples(times: Sequence[ServerTimes]) -> Samples:
    return Samples(tpot=[t.tpot * 1000 for t in times if t.completion_tokens > 1],
                   ttft=[t.ttft * 1000 for t in times],
                   itl_chunk=[gap * 1000 for t in times for gap in t.chunk_itl()],
                   itl_token=[gap * 1000 for t in times for gap in t.token_itl()])


@dataclass(frozen=True)
class Pacing:
    """The simulator's emission gaps over its configured step: median, mean and p99."""

    median: float
    mean: float
    p99: float

    @property
    def off(self) -> list[str]:
        """What was off: each of median, mean (by PACING_TOLERANCE) and p99 (by TAIL_TOLERANCE) that missed."""
        limits = (("median", self.median, PACING_TOLERANCE), ("mean", self.mean, PACING_TOLERANCE),
                  ("p99", self.p99, TAIL_TOLERANCE))
        return [f"{name} gap {value:.3f} x step" for name, value, tolerance in limits
                if not (abs(value - 1) <= tolerance if name != "p99" else value - 1 <= tolerance)]

    @property
    def on_time(self) -> bool:
        return not self.off

    def __str__(self) -> str:
        return f"{self.median:.3f} / {self.mean:.3f} / {self.p99:.3f}"


def timeline(times: Sequence[ServerTimes], step_ms: float, bin_s: float = 0.5) -> str:
    """Where the late gaps fall (--timeline): per half second from the first arrival, the requests that arrived and
    finished, the emission gaps that ended, those over TAIL_TOLERANCE late, and the longest, in steps."""
    start = min(t.arrival for t in times)
    bins: dict[int, list[float]] = {}

    def row(at: float) -> list[float]:
        return bins.setdefault(int((at - start) / bin_s), [0, 0, 0, 0, 0.0])

    for t in times:
        row(t.arrival)[0] += 1
        row(t.last_token)[1] += 1
        for earlier, later in zip(t.emissions, t.emissions[1:], strict=False):
            gap, cell = (later - earlier) * 1000 / step_ms, row(later)
            cell[2] += 1
            cell[3] += gap - 1 > TAIL_TOLERANCE
            cell[4] = max(cell[4], gap)
    rows = [[f"{index * bin_s:.1f}", *(f"{v:.0f}" for v in cell[:4]), f"{cell[4]:.2f}"]
            for index, cell in sorted(bins.items())]
    return markdown_table(["s", "arrived", "finished", "gaps", "late gaps", "longest gap / step"], rows)


def pacing(times: Sequence[ServerTimes], step_ms: float) -> Pacing:
    gaps = sorted(gap * 1000 / step_ms for t in times for gap in t.chunk_itl())
    if not gaps:
        return Pacing(float("nan"), float("nan"), float("nan"))
    return Pacing(statistics.median(gaps), statistics.fmean(gaps), gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))])


# ---------------------------------------------------------------- the tools


@dataclass(frozen=True)
class Simulator:
    url: str
    emission_log: Path


def simulator_args(workload: Workload, concurrency: int) -> list[str]:
    """The DSpark cell; with shards, as many DP ranks (each shard schedules whole ranks). The cap is per rank, and
    the kernel spreads connections over the shards unevenly: each rank may take them all, so none queues."""
    ranks = workload.shards
    dp = ["--tp-size", str(ranks), "--dp-size", str(ranks)] if ranks > 1 else []
    return [*SPECULATIVE_ARGS, *dp, "--enable-metrics", "--max-running-requests", str(max(concurrency, 48))]


def simulator_cpu_seconds(url: str) -> float:
    """The simulator's CPU time so far, every shard's (its /metrics process_cpu_seconds, summed over shards)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"{url}/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "sglang:process_cpu_seconds_total")


@contextlib.contextmanager
def fresh_simulator(workload: Workload, concurrency: int, frontend_python: str | None = None) -> Iterator[Simulator]:
    """A new simulator of the DSpark cell. SGLang caps a DSpark server at 48 running requests unless told
    otherwise (the simulator follows its admission rules): the cap is raised to the concurrency, as anyone
    measuring that many streams would, so TTFT is not the queue's."""
    with tempfile.TemporaryDirectory(prefix="speed-fidelity-") as scratch:
        log = Path(scratch) / "emissions.jsonl"
        env = {"DSPARK_SIM_DECODE_STEP_MS": str(workload.step_ms),
               "DSPARK_SIM_PREFILL_MS_PER_TOKEN": str(workload.prefill_ms_per_token),
               "DSPARK_SIM_EMISSION_LOG": str(log), "DSPARK_SIM_SPEC_BATCH_COST": "0",
               "DSPARK_SIM_SHARDS": str(workload.shards)}
        args = simulator_args(workload, concurrency)
        with running_simulator(env, args, model=MODEL, frontend_python=frontend_python,
                               boot_timeout=600 if frontend_python else 60) as url:
            yield Simulator(url, log)


@dataclass(frozen=True)
class Traffic:
    """What every tool sends: prompts calibrated once on a simulator (the same tokenizer in every run)."""

    prompts: tuple[str, ...]  # measured, identical for every tool
    suite_warmup: tuple[str, ...]  # the suite's own warm-up (bench_serving warms up with its first prompt)


def traffic(workload: Workload, concurrency: int) -> Traffic:
    with fresh_simulator(workload, concurrency) as sim:
        overhead, per_word = calibrate(Server(base_url=sim.url, model=MODEL, api_key="EMPTY", request_timeout=60))
    return Traffic(build_prompts(max(8, 2 * concurrency), workload.input_len, overhead, per_word, seed=1),
                   build_prompts(min(concurrency, SUITE_WARMUP_LIMIT), workload.input_len, overhead, per_word, seed=2))


def make_suite(client: str) -> Callable:
    return lambda sim, workload, sent, concurrency: run_suite(sim, workload, sent, concurrency, client)


def run_suite(sim: Simulator, workload: Workload, sent: Traffic, concurrency: int, client: str) -> ToolMeasurement:
    server = Server(base_url=sim.url, model=MODEL, api_key="EMPTY", request_timeout=600)
    prompts = sent.prompts
    settings = SpeedSettings(num_requests=len(prompts), concurrency=concurrency, input_len=workload.input_len,
                             output_len=workload.output_len, warmup_requests=len(sent.suite_warmup), workers=1,
                             ignore_eos=not workload.natural_lengths, client=client)
    results = run_measurement(server, settings, prompts, sent.suite_warmup)
    timings = [t for result in results for t in result.timings if t.ok]
    if len(timings) < len(prompts):
        raise SystemExit(f"suite: {len(prompts) - len(timings)} requests failed at concurrency {concurrency}")
    paired = pair_with_server(timings, sim.emission_log)
    samples = Samples(tpot=[t.tpot * 1000 for t in timings if t.tpot is not None],
                      ttft=[t.ttft * 1000 for t in timings],
                      itl_chunk=[gap * 1000 for t in timings for gap in t.itl],
                      itl_token=[gap * 1000 for t in timings for gap in (t.token_itl() or ())])
    overhead = client_overhead_metrics(results)
    extra = {"before_server_ms_mean": statistics.fmean(p.before_server_s * 1000 for p in paired),
             "after_first_token_ms_mean": statistics.fmean(p.after_first_token_s * 1000 for p in paired),
             "ttfb_ms_median": overhead.get("client_ttfb_ms_median", float("nan")),
             "loop_lag_ms_p99": overhead.get("client_loop_lag_ms_p99", float("nan")),
             "connections_opened_in_window": float(sum(r.connections_opened_in_window or 0 for r in results))}
    return ToolMeasurement(samples.stats(), [p.server for p in paired], extra)


def make_bench_serving(python: str) -> Callable:
    from bench.sglang_bench_serving import run_bench_serving  # only with the tool: it needs sglang's venv

    def run(sim: Simulator, workload: Workload, sent: Traffic, concurrency: int) -> ToolMeasurement:
        """bench_serving as its users run it (its default single warm-up, no --print-requests): its own printed
        figures, and the chunk gaps from --output-details for the per-chunk ITL it does not print."""
        with tempfile.TemporaryDirectory(prefix="bench-serving-") as workdir:
            result = run_bench_serving(python, sim.url, MODEL, sent.prompts, workload.output_len, concurrency,
                                       BENCH_SERVING_WARMUP, Path(workdir), print_requests=False)
        truth = last_arrivals(sim.emission_log, len(sent.prompts), len(sent.prompts) + BENCH_SERVING_WARMUP)
        m = result.metrics
        chunk_gaps = Samples([], [], [gap * 1000 for r in result.requests for gap in r.itl_s], []).stats()
        ours = {"tpot_mean": m.mean_tpot_ms, "tpot_p99": m.p99_tpot_ms, "ttft_median": m.median_ttft_ms,
                "ttft_mean": m.mean_ttft_ms, "itl_token_mean": m.mean_itl_ms, "itl_token_p99": m.p99_itl_ms,
                **chunk_gaps}
        return ToolMeasurement(ours, truth)
    return run


def measure(tool: str, run: Callable, workload: Workload, sent: Traffic, concurrency: int) -> Repeat:
    """One repeat; besides the figures, CPU time per chunk the measured requests got: the simulator's (all shards;
    its capacity per core is the inverse, whatever else runs on the machine) and the bench process's own (the
    in-process suite's client; not bench_serving's, a subprocess)."""
    load = os.getloadavg()[0]
    with fresh_simulator(workload, concurrency, FRONTEND_PYTHON.get(tool)) as sim:
        sim_cpu, client_cpu = simulator_cpu_seconds(sim.url), time.process_time()
        measured = run(sim, workload, sent, concurrency)
        client_cpu = time.process_time() - client_cpu
        sim_cpu = simulator_cpu_seconds(sim.url) - sim_cpu
    chunks = max(1, sum(len(t.emissions) for t in measured.truth))
    span = max(t.last_token for t in measured.truth) - min(t.arrival for t in measured.truth)
    cpu = {"sim_cpu_us_per_chunk": sim_cpu / chunks * 1e6, "chunks_per_s": chunks / span, "sim_cores": sim_cpu / span,
           **({"client_cpu_us_per_chunk": client_cpu / chunks * 1e6} if tool in ("suite", "suite-openai") else {})}
    if "timeline" in PRINTED:
        print(timeline(measured.truth, workload.step_ms), file=sys.stderr, flush=True)
    ours = measured.ours
    repeat = Repeat(tool, concurrency, ours, server_samples(measured.truth).stats(),
                    pacing(measured.truth, workload.step_ms), load, {**measured.extra, **cpu})
    print(f"  {tool} conc {concurrency}: load {load:.2f}, simulator {cpu['sim_cpu_us_per_chunk']:.0f} us CPU/chunk, "
          f"pacing {repeat.pacing}"
          f"{'' if repeat.kept else ' (discarded: ' + ', '.join(repeat.pacing.off) + ')'}, TPOT {ours['tpot_mean']:.2f} ms vs truth "
          f"{repeat.truth['tpot_mean']:.2f}, TTFT excess {repeat.ttft_excess_ms:.1f} ms", file=sys.stderr, flush=True)
    return repeat


# tool name -> its runner, made from the command line
TOOLS: dict[str, Callable] = {"suite": lambda args: make_suite("aiohttp"),
                              "suite-openai": lambda args: make_suite("openai"),
                              "bench_serving": lambda args: make_bench_serving(args.bench_serving),
                              "suite-frontend": lambda args: make_suite("aiohttp")}
FRONTEND_PYTHON: dict[str, str] = {}  # tool -> the Python running SGLang's own front end for it (set by main)
PRINTED: set[str] = set()  # what main asked to print besides the tables ("timeline": --timeline)


# ---------------------------------------------------------------- repeats


def collect(args, workload: Workload, tools: dict[str, Callable]) -> list[Repeat]:
    """Every repeat run, discarded ones included; tools alternate within a repeat so they share the machine's mood."""
    repeats: list[Repeat] = []
    for concurrency in args.concurrencies:
        sent = traffic(workload, concurrency)
        for _ in range(args.repeats * 2):  # room for discarded repeats
            kept = {tool: sum(r.kept for r in repeats if (r.tool, r.concurrency) == (tool, concurrency))
                    for tool in tools}
            if min(kept.values()) >= args.repeats:
                break
            repeats += [measure(tool, run, workload, sent, concurrency)
                        for tool, run in tools.items() if kept[tool] < args.repeats]
    return repeats


def spread(values: Sequence[float], fmt: str) -> str:
    """min / median / max, or "—" with no value."""
    if not values:
        return "—"
    return " / ".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))


# ---------------------------------------------------------------- tables


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def comparison_table(repeats: Sequence[Repeat], tools: Sequence[str]) -> str:
    """Per concurrency and quantity: each tool and the truth in ms, and each tool / its own run's truth."""
    header = ["conc", "quantity", *(f"{t} ms" for t in tools), "truth ms", *(f"{t} / truth" for t in tools)]
    rows = []
    for concurrency in sorted({r.concurrency for r in repeats}):
        kept = {tool: [r for r in repeats if r.kept and (r.tool, r.concurrency) == (tool, concurrency)]
                for tool in tools}
        for key, name in QUANTITIES:
            truth = [r.truth[key] for runs in kept.values() for r in runs]
            rows.append([str(concurrency), name,
                         *(spread([r.ours[key] for r in kept[t] if key in r.ours], ".2f") for t in tools),
                         spread(truth, ".2f"),
                         *(spread([r.ours[key] / r.truth[key] for r in kept[t] if key in r.ours], ".3f")
                           for t in tools)])
    return markdown_table(header, rows)


def ttft_table(repeats: Sequence[Repeat], tools: Sequence[str]) -> str:
    """Where TTFT's excess over the server's lies, and what the suite's client itself adds."""
    header = ["conc", *(f"{t} TTFT excess ms" for t in tools),
              "suite: before server + after first token ms", "suite TTFB median ms", "suite loop lag p99 ms",
              "suite connections opened in window"]
    rows = []
    for concurrency in sorted({r.concurrency for r in repeats}):
        kept = {tool: [r for r in repeats if r.kept and (r.tool, r.concurrency) == (tool, concurrency)]
                for tool in tools}
        suite = kept.get("suite", [])

        def suite_extra(key: str, fmt: str = ".1f", suite: list = suite) -> str:  # this concurrency's repeats
            return spread([r.extra[key] for r in suite], fmt)

        split = "—" if not suite else (f"{statistics.median(r.extra['before_server_ms_mean'] for r in suite):.1f} + "
                                       f"{statistics.median(r.extra['after_first_token_ms_mean'] for r in suite):.1f}")
        rows.append([str(concurrency), *(spread([r.ttft_excess_ms for r in kept[t]], ".1f") for t in tools), split,
                     suite_extra("ttfb_ms_median"), suite_extra("loop_lag_ms_p99"),
                     suite_extra("connections_opened_in_window", ".0f")])
    return markdown_table(header, rows)


def repeats_table(repeats: Sequence[Repeat]) -> str:
    rows = [[str(r.concurrency), r.tool, f"{r.load_average:.2f}", str(r.pacing),
             f"{r.extra['sim_cpu_us_per_chunk']:.0f}", f"{r.extra['chunks_per_s']:,.0f}", f"{r.extra['sim_cores']:.2f}",
             f"{r.extra.get('client_cpu_us_per_chunk', float('nan')):.0f}",
             "kept" if r.kept else "discarded: " + ", ".join(r.pacing.off)] for r in repeats]
    return markdown_table(["conc", "tool", "load average (1 min) before",
                           "simulator gap / configured step: median / mean / p99", "simulator CPU us / chunk",
                           "simulator chunks/s", "simulator cores", "client CPU us / chunk", "rule"], rows)


def verdicts(repeats: Sequence[Repeat], concurrency: int, step_ms: float) -> list[str]:
    """The claims, computed from the repeats (not written by hand): at every concurrency the simulator's emission gaps
    against its configured step over all its repeats (discarded ones too), the suite's TPOT against the truth (the
    server's own recorded emission times for the same requests), and the simulator's capacity; at the highest
    concurrency, the TTFT excess."""
    lines = []
    for conc in sorted({r.concurrency for r in repeats}):
        every = [r for r in repeats if r.concurrency == conc]
        worst_mean = max(abs(r.pacing.mean - 1) for r in every)
        lines.append(f"at {conc} streams, the simulator against its configured {step_ms:g} ms step: mean emission gap "
                     f"within {worst_mean:.2%} in all {len(every)} repeats ({'within' if worst_mean <= 0.02 else 'NOT within'}"
                     f" 2 %), p99 gap {spread([r.pacing.p99 for r in every], '.2f')} steps (min / median / max; the rule "
                     f"keeps <= {1 + TAIL_TOLERANCE:g}); {sum(not r.kept for r in every)} discarded")
        suite = [r for r in every if r.kept and r.tool == "suite"]
        for key, name in (("tpot_mean", "TPOT mean"), ("tpot_p99", "TPOT p99")):
            if suite:
                worst = max(abs(r.ours[key] / r.truth[key] - 1) for r in suite)
                lines.append(f"at {conc} streams, the suite's {name} against the truth (the server's recorded emission "
                             f"times): within {worst:.2%} in every kept repeat ({'within' if worst <= 0.01 else 'NOT within'}"
                             f" 1 %)")
        lines.append(f"at {conc} streams the simulator emitted {spread([r.extra['chunks_per_s'] for r in every], ',.0f')} "
                     f"chunks/s in total on {spread([r.extra['sim_cores'] for r in every], '.2f')} cores of CPU "
                     f"(min / median / max)")
    per_chunk = [r.extra["sim_cpu_us_per_chunk"] for r in repeats]
    lines.append(f"simulator CPU per chunk over all repeats: {spread(per_chunk, '.0f')} us (min / median / max; a "
                 f"request's own cost included), so one core paces about {1e6 / statistics.median(per_chunk):,.0f} "
                 f"chunks/s (at the median)")
    kept = [r for r in repeats if r.kept and r.concurrency == concurrency]
    suite = [r for r in kept if r.tool == "suite"]
    others = [r for r in kept if r.tool == "bench_serving"]
    if suite and others:
        ratio = (statistics.median(r.ttft_excess_ms for r in suite)
                 / statistics.median(r.ttft_excess_ms for r in others))
        lines.append(f"at {concurrency} streams, the suite's TTFT excess over the truth is {ratio:.2f} of "
                     f"bench_serving's (medians over repeats; {'at most' if ratio <= 0.5 else 'MORE than'} half)")
    return lines


# ---------------------------------------------------------------- SGLang's real engine (--engine PYTHON)
# One engine boot per repeat (--server sglang-engine's wrapper: the tiny Llama on this CPU); the suite, then
# bench_serving, send the same calibrated prompts, without warm-up, each between two reads of the engine's own
# /metrics histograms: the truth is SGLang's per-request timestamps (TokenizerManager's time_stats) as its
# TTFT and time-per-output-token histograms sum them (mean = delta sum / delta count).

ENGINE_MODEL = "dspark-ci/tiny-llama"
ENGINE_HISTOGRAMS = {"ttft_mean": "sglang:time_to_first_token_seconds",
                     "tpot_mean": "sglang:request_time_per_output_token_seconds"}


@contextlib.contextmanager
def running_engine(python: str, log: Path) -> Iterator[str]:
    from dspark_ci.ground.processes import free_port
    from dspark_ci.launchers.materialize import ENGINE_ENTRY

    port = free_port()
    argv = [python, str(ENGINE_ENTRY), "--model-path", ENGINE_MODEL, "--host", "127.0.0.1", "--port", str(port),
            "--enable-metrics"]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 900
            while not _healthy(url):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the engine did not come up (log: {log})")
                time.sleep(1)
            yield url
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=5).status_code == 200
    except requests.RequestException:
        return False


def histogram_totals(url: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of each ENGINE_HISTOGRAMS family, over its label sets."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = {name: [0.0, 0.0] for name in ENGINE_HISTOGRAMS.values()}
    for family in text_string_to_metric_families(requests.get(f"{url}/metrics", timeout=30).text):
        for sample in family.samples:
            for name in totals:
                if sample.name == name + "_sum":
                    totals[name][0] += sample.value
                elif sample.name == name + "_count":
                    totals[name][1] += sample.value
    return {name: (total[0], total[1]) for name, total in totals.items()}


def server_means(before: dict, after: dict) -> dict[str, float]:
    means = {}
    for key, name in ENGINE_HISTOGRAMS.items():
        count = after[name][1] - before[name][1]
        means[key] = (after[name][0] - before[name][0]) / count * 1000 if count else float("nan")
    return means


def engine_tools(url: str, workload: Workload, prompts: tuple[str, ...], concurrency: int,
                 bench_python: str | None, scratch: Path) -> dict[str, tuple[dict, dict]]:
    """Each tool's mean TTFT and TPOT (ms) beside the engine's own for the same requests."""
    from dspark_ci.sglang_sim.cpu_engine import MODEL_DIR

    from bench.sglang_bench_serving import run_bench_serving

    server = Server(base_url=url, model=ENGINE_MODEL, api_key="EMPTY", request_timeout=1800)
    measured = {}
    before = histogram_totals(url)
    settings = SpeedSettings(num_requests=len(prompts), concurrency=concurrency, input_len=workload.input_len,
                             output_len=workload.output_len, warmup_requests=0, workers=1, ignore_eos=True,
                             client="aiohttp")
    timings = [t for r in run_measurement(server, settings, prompts, ()) for t in r.timings if t.ok]
    measured["suite"] = ({"ttft_mean": statistics.fmean(t.ttft * 1000 for t in timings if t.ttft is not None),
                          "tpot_mean": statistics.fmean(t.tpot * 1000 for t in timings if t.tpot is not None)},
                         server_means(before, histogram_totals(url)))
    if bench_python:
        tokenizer = scratch / "bench" / "tokenizer"
        tokenizer.mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):  # count tokens as the engine does
            (tokenizer / name).write_bytes((MODEL_DIR / "target" / name).read_bytes())
        before = histogram_totals(url)
        result = run_bench_serving(bench_python, url, ENGINE_MODEL, prompts, workload.output_len, concurrency, 0,
                                   scratch / "bench", print_requests=False)
        measured["bench_serving"] = ({"ttft_mean": result.metrics.mean_ttft_ms,
                                      "tpot_mean": result.metrics.mean_tpot_ms},
                                     server_means(before, histogram_totals(url)))
    return measured


def engine_main(args, workload: Workload) -> None:
    rows: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="speed-fidelity-engine-") as scratch:
            load = os.getloadavg()[0]
            with running_engine(args.engine, Path(scratch) / "engine.log") as url:
                overhead, per_word = calibrate(Server(base_url=url, model=ENGINE_MODEL, api_key="EMPTY",
                                                      request_timeout=600))
                prompts = build_prompts(max(8, 2 * args.concurrencies[0]), workload.input_len, overhead, per_word,
                                        seed=1)
                measured = engine_tools(url, workload, prompts, args.concurrencies[0], args.bench_serving,
                                        Path(scratch))
        for tool, (ours, truth) in measured.items():
            for key in ENGINE_HISTOGRAMS:
                rows.setdefault((tool, key), []).append((ours[key], truth[key]))
            print(f"  repeat {repeat + 1} {tool}: load {load:.2f}, TTFT {ours['ttft_mean']:.1f} ms vs engine "
                  f"{truth['ttft_mean']:.1f}, TPOT {ours['tpot_mean']:.2f} ms vs engine {truth['tpot_mean']:.2f}",
                  file=sys.stderr, flush=True)
    table = [[tool, key, spread([o for o, _ in pairs], ".2f"), spread([t for _, t in pairs], ".2f"),
              spread([o / t for o, t in pairs], ".3f")] for (tool, key), pairs in rows.items()]
    print(markdown_table(["tool", "quantity", "tool ms", "engine's own ms", "tool / engine"], table))


# ---------------------------------------------------------------- main


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    return (f"nproc={os.cpu_count()}, CPU: {cpu}, Python {platform.python_version()}, {platform.system()} "
            f"{platform.release()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="kept repeats per tool and concurrency (>= 3)")
    parser.add_argument("--concurrencies", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--tools", nargs="+", default=["suite", "bench_serving"], choices=list(TOOLS),
                        help="suite-openai: the suite with speed.client=openai (the official client reads the streams); "
                        "suite-frontend: the suite through SGLang's own front end in front of the same engine")
    parser.add_argument("--bench-serving", metavar="PYTHON", default=os.environ.get("DSPARK_SGLANG_PYTHON"),
                        help=f"the python of a venv with sglang {DEFAULT_VERSION} (.ci/sglang-bench-serving.sh makes one; "
                        ".ci/sglang-frontend.sh adds what suite-frontend needs)")
    parser.add_argument("--engine", metavar="PYTHON",
                        help=f"measure against SGLang {DEFAULT_VERSION}'s real engine on this CPU "
                        "(the venv of .ci/sglang-engine.sh) instead of the simulator: suite and bench_serving vs the "
                        "engine's own TTFT and TPOT histograms; the first --concurrencies value")
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--shards", type=int, default=1,
                        help="simulator processes (DSPARK_SIM_SHARDS; the cell gets --dp-size N so each schedules a "
                        "rank): one paces ~256 streams at 20 ms steps on a core")
    parser.add_argument("--prefill-ms-per-token", type=float, default=0.5)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--natural-lengths", action="store_true",
                        help="suite tools only: no ignore_eos, replies end where the simulated model says EOS (at most "
                        "--output-len tokens), so their lengths spread and finishes (and the next arrivals) do not come "
                        "in waves")
    parser.add_argument("--timeline", action="store_true",
                        help="print, per repeat, where the late emission gaps fall (per half second: arrivals, "
                        "finishes, gaps, late gaps)")
    parser.add_argument("--smoke", action="store_true",
                        help="CI's check that the bench still runs: the suite alone at 4 streams, short replies")
    args = parser.parse_args()
    if args.smoke:
        args.tools, args.concurrencies, args.input_len, args.output_len = ["suite"], [4], 64, 16
    if args.repeats < 3:
        parser.error("--repeats: at least 3 (a figure is min / median / max over repeats)")
    needing_venv = [tool for tool in ("bench_serving", "suite-frontend") if tool in args.tools]
    if needing_venv and not args.bench_serving:
        parser.error(f"--bench-serving PYTHON (or DSPARK_SGLANG_PYTHON) is needed for {', '.join(needing_venv)}; "
                     "make one with bash .ci/sglang-bench-serving.sh and .ci/sglang-frontend.sh, or pass --tools suite")
    if "suite-frontend" in args.tools:
        FRONTEND_PYTHON["suite-frontend"] = args.bench_serving
    if args.timeline:
        PRINTED.add("timeline")
    if args.shards < 1:
        parser.error("--shards: at least 1")
    if args.natural_lengths and "bench_serving" in args.tools:
        parser.error("--natural-lengths: the suite tools only (bench_serving sends --output-len with ignore_eos)")
    workload = Workload(args.input_len, args.output_len, args.step_ms, args.prefill_ms_per_token, args.shards,
                        args.natural_lengths)
    if args.engine:
        print(f"command: python {' '.join(sys.argv)}\nmachine: {machine()}\n"
              f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}\n"
              f"workload: SGLang {DEFAULT_VERSION}'s real engine (--server sglang-engine, tiny Llama on this CPU), "
              f"{args.input_len} prompt tokens, {args.output_len} output tokens (ignore_eos), concurrency "
              f"{args.concurrencies[0]}; min / median / max over {args.repeats} repeats, one engine boot each\n")
        engine_main(args, workload)
        return
    tools = {tool: TOOLS[tool](args) for tool in args.tools}
    started = time.monotonic()
    print(f"command: python {' '.join(sys.argv)}\nmachine: {machine()}\n"
          f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}\n"
          f"workload: DSpark simulator ({' '.join(simulator_args(workload, 0)[:-1])} max(conc, 48); "
          f"DSPARK_SIM_SHARDS={args.shards}, DSPARK_SIM_SPEC_BATCH_COST=0), step {args.step_ms:g} ms, prefill "
          f"{args.prefill_ms_per_token:g} ms/token, {args.input_len} prompt tokens, "
          f"{'up to ' if args.natural_lengths else ''}{args.output_len} output tokens "
          f"({'the model ends at EOS' if args.natural_lengths else 'ignore_eos'}), 2 x concurrency requests (at least 8); "
          f"min / median / max over {args.repeats} kept repeats\n")
    repeats = collect(args, workload, tools)
    print(f"Suite vs bench_serving vs the server's truth:\n\n{comparison_table(repeats, list(tools))}\n")
    print(f"TTFT excess over the server's TTFT, and the client's own overhead:\n\n"
          f"{ttft_table(repeats, list(tools))}\n")
    print(f"Repeats (discarded when the median or mean gap is off by more than {PACING_TOLERANCE:.0%}, or the p99 "
          f"gap by more than {TAIL_TOLERANCE:.0%}):\n\n{repeats_table(repeats)}\n")
    for line in verdicts(repeats, max(args.concurrencies), args.step_ms):
        print(line)
    print(f"\nload average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"whole run {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
