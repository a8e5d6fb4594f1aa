"""Where speculation pays: the speedup over the same deployment without speculation across concurrency and input
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
from dataclasses import replace
from typing import Sequence

from ground.measurements import Envelope, EnvelopeBoundary, EnvelopePoint, crossing
from suites.server import Server
from suites.speed import SpeedSettings, build_prompts, run_measurement

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
    """The speed_envelope record of the suite output (results.json's ``envelope``: ``ground.measurements.Envelope``)."""
    lens = sorted({p.input_len for p in points})
    return Envelope(tuple(points), {str(length): EnvelopeBoundary(*boundary(points, length)) for length in lens},
                    "random text", "median TPOT without speculation / with it per point; boundary log-interpolated "
                    "in concurrency").to_dict()
