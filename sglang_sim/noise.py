"""The simulator's noise model: what makes two boots, and two requests, of one server differ.

Off by default (every knob 0): the simulator is then as deterministic as it always was. Turned on by
``DSPARK_SIM_*`` settings (``sim_config.py``):

- ``STEP_JITTER_BOOT`` (σ_b): each boot draws one factor exp(N(0, σ_b²)) for its decode step time: the
  run-to-run (per-boot) component of TPOT and throughput, which more requests on the same boot never average away;
- ``STEP_JITTER_REQUEST`` (σ_r): each request draws its own factor exp(N(0, σ_r²)) on top: the per-request
  component, which averages away over requests;
- ``ACCEPT_DRIFT_BOOT`` (σ_α): each boot shifts the accept probability α by N(0, σ_α²) (clipped to [0, 1]);
- ``GPQA_CONCENTRATION`` (c): each question gets its own probability of being answered right,
  p_q ~ Beta(c·a, c·(1 − a)) for accuracy a, fixed per question and seed (the u_q-quantile of that Beta for a
  uniform u_q per question, so a lower accuracy lowers every question's probability: the same questions,
  harder); every sample is then drawn with p_q (small c: most questions always or never right, as for a strong
  model; 0: today's fixed answer);
- ``BOOT_SEED``: the seed of the per-boot draws (unset: a fresh one every boot, as real boots differ).

Per-boot draws come from one ``random.Random`` seeded once at start; per-request factors from a stream
seeded from it, so a boot's requests are repeatable given ``BOOT_SEED``.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace


@dataclass
class BootNoise:
    """This boot's draws."""

    step_factor: float = 1.0  # multiplies every decode step of this boot
    accept_shift: float = 0.0  # added to α for this boot
    request_jitter: float = 0.0  # σ of each request's own step factor (log scale)
    nonce: str = ""  # salts per-sample GPQA draws so two boots answer independently ("" when off)
    _seed: int = 0
    _requests: Iterator[int] = field(default_factory=itertools.count)

    @classmethod
    def of(cls, config) -> BootNoise:
        """This boot's draws from a ``SimConfig``."""
        return cls.draw(config.step_jitter_boot, config.step_jitter_request, config.accept_drift_boot, config.boot_seed)

    @classmethod
    def draw(cls, step_jitter_boot: float, step_jitter_request: float, accept_drift_boot: float,
             boot_seed: int | None) -> BootNoise:
        seed = boot_seed if boot_seed is not None else int.from_bytes(os.urandom(8), "little")
        rng = random.Random(f"boot\x1f{seed}")
        return cls(step_factor=math.exp(rng.gauss(0.0, step_jitter_boot)) if step_jitter_boot else 1.0,
                   accept_shift=rng.gauss(0.0, accept_drift_boot) if accept_drift_boot else 0.0,
                   request_jitter=step_jitter_request, nonce=f"{seed:x}", _seed=seed)

    def counting_requests_with(self, requests: Iterator[int]) -> BootNoise:
        """The same boot's draws, its requests numbered by ``requests`` (a counter shared by a server's shards, so
        the per-request stream is the one server's, whichever process serves the request)."""
        return replace(self, _requests=requests)

    def request_factor(self) -> float:
        """The step-time factor of the next request (1.0 without per-request jitter)."""
        if not self.request_jitter:
            return 1.0
        rng = random.Random(f"request\x1f{self._seed}\x1f{next(self._requests)}")
        return math.exp(rng.gauss(0.0, self.request_jitter))

    def alpha(self, accept_prob: float) -> float:
        return min(1.0, max(0.0, accept_prob + self.accept_shift))


@functools.lru_cache(maxsize=4096)
def question_probability(quantile: float, accuracy: float, concentration: float) -> float:
    """The ``quantile`` of Beta(c·a, c·(1 − a)): one question's probability of being answered right."""
    from scipy.special import betaincinv  # only with GPQA_CONCENTRATION set; the simulator starts without it

    accuracy = min(max(accuracy, 1e-6), 1 - 1e-6)
    return float(betaincinv(concentration * accuracy, concentration * (1 - accuracy), quantile))
