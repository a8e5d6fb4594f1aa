"""Where speculation pays: the speedup over the same deployment without speculation on the speed suite's own
requests (``alternating_speedup``), and over the same deployment without speculation across concurrency and input
length, measured on one boot of each, and the boundary where it falls to 1.

At each point (concurrency c, input length L) the same ``max(c, sweep_min_requests)`` requests (random text, as
bench_serving's random dataset) go to both servers, c at a time: speedup = median TPOT without speculation / with
it; its standard error by bootstrap over requests (both sides resampled). The boundary along concurrency, per input
length, is where the speedup crosses 1, interpolated linearly in log c between the last grid point that pays and the
first that does not; "beyond the grid" when every point pays (reported as the largest concurrency, censored), 0 when
none does. Accept figures from these requests are on random text: never draft quality (CONTRACT.md).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from dspark_ci.ground.measurements import Envelope, EnvelopeBoundary, EnvelopePoint, crossing
from dspark_ci.suites.server import Server
from dspark_ci.suites.speed import RequestTiming, SpeedSettings, build_prompts, run_measurement

BOOTSTRAP_RESAMPLES = 400


def _tpots(server: Server, settings: SpeedSettings, prompts: Sequence[str]) -> list[float]:
    return [t.tpot for result in run_measurement(server, settings, prompts, ()) for t in result.timings
            if t.tpot is not None]


def speedup_stderr(ours: Sequence[float], theirs: Sequence[float], seed: int) -> float | None:
    """Standard error of median(theirs) / median(ours), by bootstrap over the requests of both sides."""
    if len(ours) < 2 or len(theirs) < 2:
        return None
    rng = random.Random(seed)
    ratios = [statistics.median(rng.choices(theirs, k=len(theirs))) / statistics.median(rng.choices(ours, k=len(ours)))
              for _ in range(BOOTSTRAP_RESAMPLES)]
    return statistics.stdev(ratios)


@dataclass(frozen=True)
class AlternatingSpeedup:
    """The same requests sent to a speculative server and to its reference in rounds, alternating which goes first."""

    ours: tuple[RequestTiming, ...]
    theirs: tuple[RequestTiming, ...]
    rounds: tuple[tuple[float, float], ...]  # each round's median TPOT (ms): ours, theirs

    def metrics(self) -> dict[str, float]:
        ours, theirs = _tpots_of(self.ours), _tpots_of(self.theirs)
        if not ours or not theirs:
            return {}
        stderr = speedup_stderr(ours, theirs, seed=len(ours))
        return {"speculative_speedup": statistics.median(theirs) / statistics.median(ours),
                **({"speculative_speedup_stderr": stderr} if stderr is not None else {})}


def alternating_speedup(server: Server, reference: Server, settings: SpeedSettings, prompts: Sequence[str],
                        warmup: Sequence[str], rounds: int) -> AlternatingSpeedup:
    """Round r sends prompts[r::rounds] to both servers, the reference first in even rounds: the machine's load
    (another process, a neighbour's job) then falls on both sides alike, where measuring one side after the other
    would hand each a load of its own. The reference is warmed first with ``warmup`` (this server already was)."""
    once = replace(settings, warmup_requests=0, workers=1)
    if warmup:
        run_measurement(reference, once, warmup, ())
    ours: list[RequestTiming] = []
    theirs: list[RequestTiming] = []
    medians = []
    for index in range(rounds):
        chunk = prompts[index::rounds]
        if not chunk:
            continue
        servers = {"ours": server, "theirs": reference}
        got = {side: [t for result in run_measurement(servers[side], once, chunk, ()) for t in result.timings]
               for side in (("theirs", "ours") if index % 2 == 0 else ("ours", "theirs"))}  # dicts keep this order
        ours.extend(got["ours"])
        theirs.extend(got["theirs"])
        ours_tpots, theirs_tpots = _tpots_of(got["ours"]), _tpots_of(got["theirs"])
        if ours_tpots and theirs_tpots:
            medians.append((statistics.median(ours_tpots) * 1000, statistics.median(theirs_tpots) * 1000))
    return AlternatingSpeedup(tuple(ours), tuple(theirs), tuple(medians))


def _tpots_of(timings: Sequence[RequestTiming]) -> list[float]:
    return [t.tpot for t in timings if t.tpot is not None]


def sweep(server: Server, reference: Server, base: SpeedSettings, concurrencies: Sequence[int],
          input_lens: Sequence[int], min_requests: int, output_len: int, overhead: float,
          tokens_per_word: float) -> list[EnvelopePoint]:
    points = []
    for input_len in input_lens:
        for concurrency in concurrencies:
            requests = max(concurrency, min_requests)
            settings = replace(base, num_requests=requests, concurrency=concurrency, input_len=input_len,
                               output_len=output_len, warmup_requests=0, workers=1, ignore_eos=True)
            prompts = build_prompts(requests, input_len, overhead, tokens_per_word,
                                    seed=concurrency * 100003 + input_len)
            ours, theirs = _tpots(server, settings, prompts), _tpots(reference, settings, prompts)
            speedup = statistics.median(theirs) / statistics.median(ours) if ours and theirs else None
            points.append(EnvelopePoint(concurrency, input_len, requests,
                                statistics.median(ours) * 1000 if ours else None,
                                statistics.median(theirs) * 1000 if theirs else None, speedup,
                                speedup_stderr(ours, theirs, seed=concurrency + input_len)))
    return points


def boundary(points: Sequence[EnvelopePoint], input_len: int) -> tuple[float | None, bool]:
    """(the concurrency where the speedup at ``input_len`` falls to 1, censored: every point pays)."""
    row = sorted((p for p in points if p.input_len == input_len and p.speedup is not None), key=lambda p: p.concurrency)
    return crossing([(p.concurrency, p.speedup) for p in row if p.speedup is not None])


def envelope_record(points: Sequence[EnvelopePoint]) -> dict:
    """The speed_envelope record of the suite output (results.json's ``envelope``:
    ``dspark_ci.ground.measurements.Envelope``)."""
    lens = sorted({p.input_len for p in points})
    return Envelope(tuple(points), {str(length): EnvelopeBoundary(*boundary(points, length)) for length in lens},
                    "random text", "median TPOT without speculation / with it per point; boundary log-interpolated "
                    "in concurrency").to_dict()
