"""A tie flip or a mismatch: what the reference's logprobs say at the first token where two greedy outputs part.

Greedy decoding takes the argmax. When two candidates carry the same logit, which one wins depends on the order a
kernel reduced in (batch size, tensor-parallel all-reduce, speculative verify versus plain decode), and a correct
engine may take either: SmolLM2-135M served by SGLang on a CPU said " dipped" without speculation and " began" with
NGRAM at the same position, both at logprob -0.8713. So at the first difference the REFERENCE's logprobs of its own
token and of the tested server's token (same prefix: the outputs agree up to there) decide.

The epsilon. Both logprobs come from one softmax over the same logits, so their gap is the gap of the two logits
(the log-sum-exp cancels). The logits are bf16: 8 significant bits, so around a value of magnitude m the
representable values are ``2**(floor(log2 m) - 7)`` apart (one bf16 step). Two logits that are equal but for the
order of a reduction land on the same bf16 value or on neighbours a step or two apart; a real bug (a wrong all-reduce,
a draft token accepted against the target) moves a logit by far more. The API shows logprobs, not logits, so the
step is taken at the magnitude of the larger of the two logprobs (the tested token's): epsilon =
``tie_ulps * bf16_step(|logprob of the tested token|)``. At -0.8713 one step is 2**-8 = 0.0039 and the default 2
steps allow 0.0078. A logit's own magnitude is usually larger than its logprob's, and its step with it: where
kernels flip near-ties a whole logit step apart (GPUs batch-variant kernels), raise ``tie_ulps``. The rule errs
toward red (a near tie read as a mismatch), never toward a gap of several steps read as a tie.

The two servers' own disagreement. The epsilon above is one rounding; two servers that reduce differently all the
way through (tp 2's all-reduce of two partial sums against one rank's single matmul, a speculative verify batch
against a one-token decode) drift apart layer after layer, and their logprobs of the same token differ by more than a
step. Up to the first difference both outputs hold the same tokens, so each position before it measures that drift:
a prompt's ``drift`` = the largest |logprob difference| of a token both took. The drift belongs to the pair of servers,
not to one prompt, so a run reads every first difference at the largest drift any of its prompts shows
(suites/parity.py ``compare_all``): a difference at an early token has almost no prefix of its own to measure it on
(NGRAM against plain decode on SmolLM2: a flip at token 17 with a gap of 0.125, its own prefix drifting 0.072).
A first difference whose gap is within ``drift_factor`` times that drift is read at the servers' own resolution: a
tie flip. The drift itself is
bounded (``max_drift``): servers whose logprobs of the same tokens part by more than that do not compute the same
function (an all-reduce skipped leaves plausible text and shifts every logprob), and their first difference is a
mismatch whatever its gap. SmolLM2-135M on SGLang's CPU engine, tp 2 against one rank (2026-12-05): drifts of 0.055,
0.10 and 0.17 over three prompts, and a first difference at token 23 (" key" for " index") with a gap of 0.125, a
tie at their resolution (epsilon 0.34) and 16 bf16 steps, so a mismatch at one rounding's.

The tested token outside the reference's top K: its logprob lies at or below the K-th (the floor). For any logprob
l at or below the floor, gap - epsilon >= |l| * (1 - tie_ulps/128) - |reference logprob| (a bf16 step at magnitude
m is at most m/128), which only grows as l falls; so when it is positive at the floor, every such token is beyond
epsilon: a mismatch, soundly, with no second request. Otherwise (the top K all within about epsilon of the
argmax, a K-way tie) it is undecided, and counted a mismatch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

BF16_SIGNIFICANT_BITS = 8
SMALLEST_NORMAL = 2.0 ** -126  # bf16 has float32's exponent range

MATCH, TIE_FLIP, MISMATCH = "match", "tie_flip", "mismatch"


@dataclass(frozen=True)
class TopLogprob:
    """One candidate at one position, as OpenAI's chat ``logprobs.content[i].top_logprobs[j]`` has it."""

    token: str
    logprob: float
    bytes: tuple[int, ...] | None = None

    @property
    def key(self) -> tuple[int, ...]:
        """What tells two candidates apart: their bytes (the text may be a lossy display of a byte fragment)."""
        return self.bytes if self.bytes is not None else tuple(self.token.encode())


@dataclass(frozen=True)
class PositionLogprobs:
    """One generated position: the token taken, its logprob, and the top candidates there (``logprobs.content[i]``)."""

    chosen: TopLogprob
    top: tuple[TopLogprob, ...]

    def logprob_of(self, candidate: TopLogprob) -> float | None:
        """The logprob this position gives ``candidate``: None when it is outside the top candidates."""
        if candidate.key == self.chosen.key:
            return self.chosen.logprob
        return next((entry.logprob for entry in self.top if entry.key == candidate.key), None)

    @property
    def floor(self) -> float | None:
        """The lowest top logprob: a token outside the top list has at most this."""
        return min((entry.logprob for entry in self.top), default=None)


@dataclass(frozen=True)
class Decision:
    """How the first difference was read: the verdict, the reference's logprob of each token, and why."""

    verdict: str  # TIE_FLIP or MISMATCH
    reference_logprob: float | None  # the reference's logprob of its own token
    tested_logprob: float | None  # the reference's logprob of the tested server's token (None: outside its top K)
    epsilon: float | None
    reason: str


def bf16_step(magnitude: float) -> float:
    """The distance between neighbouring bf16 values around ``magnitude``."""
    m = max(abs(magnitude), SMALLEST_NORMAL)
    return 2.0 ** (math.floor(math.log2(m)) - (BF16_SIGNIFICANT_BITS - 1))


def tie_epsilon(tested_logprob: float, tie_ulps: float) -> float:
    return tie_ulps * bf16_step(tested_logprob)


@dataclass(frozen=True)
class Resolution:
    """How finely two servers can be told apart: bf16 steps, and their measured drift (``drift`` None: unmeasured)."""

    tie_ulps: float
    drift: float | None = None
    drift_factor: float = 0.0
    max_drift: float = math.inf

    def epsilon(self, logprob: float) -> float:
        return max(tie_epsilon(logprob, self.tie_ulps), self.drift_factor * (self.drift or 0.0))


def prefix_drift(tested: Sequence[PositionLogprobs] | None, reference: Sequence[PositionLogprobs] | None,
                 upto: int) -> float | None:
    """The largest |logprob difference| of the same token over the first ``upto`` positions (where both outputs hold
    the same tokens); 0 with no such position, None when either side gave no logprobs."""
    if tested is None or reference is None:
        return None
    shared = zip(tested[:upto], reference[:upto], strict=False)
    return max((abs(t.chosen.logprob - r.chosen.logprob) for t, r in shared), default=0.0)


def decide(reference: PositionLogprobs | None, tested: TopLogprob | None, resolution: Resolution) -> Decision:
    """Tie flip or mismatch, at a position where the reference took ``reference.chosen`` and the tested server
    ``tested`` (None: what either side knows of it is missing, which leaves a mismatch)."""
    if reference is None or tested is None:
        side = "the reference" if reference is None else "the tested server"
        return Decision(MISMATCH, None, None, None, f"undecidable: {side} gave no logprobs at this position")
    ours, theirs = reference.chosen.logprob, reference.logprob_of(tested)
    if resolution.drift is not None and resolution.drift > resolution.max_drift:
        return Decision(MISMATCH, ours, theirs, None, f"the logprobs of the tokens both took differ by up to "
                        f"{resolution.drift:.4g}, beyond max_drift {resolution.max_drift:.4g}: not the same numerics")
    if theirs is None:
        return _outside_top(reference, resolution.tie_ulps)
    return decide_gap(ours, theirs, resolution)


def decide_gap(ours: float, theirs: float, resolution: Resolution) -> Decision:
    """Tie flip or mismatch from the reference's logprob of its own token (``ours``) and of the tested server's
    (``theirs``), the drift already within ``max_drift``: also how bench/parity_tie_rule.py re-reads recorded ones."""
    epsilon = resolution.epsilon(theirs)
    gap = ours - theirs
    verdict = TIE_FLIP if abs(gap) <= epsilon else MISMATCH
    relation = "within" if verdict == TIE_FLIP else "beyond"
    drift = "" if resolution.drift is None else f"; the servers' drift {resolution.drift:.4g}"
    return Decision(verdict, ours, theirs, epsilon,
                    f"logprob gap {gap:.4g} {relation} epsilon {epsilon:.4g}{drift}")


def _outside_top(reference: PositionLogprobs, tie_ulps: float) -> Decision:
    ours, floor = reference.chosen.logprob, reference.floor
    if floor is None:
        return Decision(MISMATCH, ours, None, None, "undecidable: the reference gave no top logprobs")
    size = len(reference.top)
    if abs(floor) * (1 - tie_ulps / 2 ** (BF16_SIGNIFICANT_BITS - 1)) > abs(ours):
        return Decision(MISMATCH, ours, None, tie_epsilon(floor, tie_ulps),
                        f"outside the reference's top {size}, whose floor {floor:.4g} is already beyond epsilon")
    return Decision(MISMATCH, ours, None, tie_epsilon(floor, tie_ulps),
                    f"undecided: outside the reference's top {size}, all within about epsilon of the argmax")


def position_logprobs(content: Sequence[dict] | None) -> tuple[PositionLogprobs, ...] | None:
    """Chat's ``logprobs.content`` (or a saved reference's copy of it) as records; None without one."""
    if content is None:
        return None
    return tuple(PositionLogprobs(_top(item), tuple(_top(entry) for entry in item.get("top_logprobs") or ()))
                 for item in content)


def _top(item: dict) -> TopLogprob:
    raw = item.get("bytes")
    return TopLogprob(str(item.get("token") or ""), float(item["logprob"]),
                      tuple(int(b) for b in raw) if raw is not None else None)


def content_of(positions: Sequence[PositionLogprobs]) -> list[dict]:
    """``position_logprobs`` undone: chat's shape, for a saved reference."""
    return [{**_entry(p.chosen), "top_logprobs": [_entry(t) for t in p.top]} for p in positions]


def _entry(top: TopLogprob) -> dict:
    return {"token": top.token, "bytes": list(top.bytes) if top.bytes is not None else None, "logprob": top.logprob}
