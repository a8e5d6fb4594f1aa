"""Sampled losslessness by distribution: per generated position, do the speculative server and its reference
(the same deployment without speculation) sample tokens from the same distribution?

What is tested. At temperature > 0 every prompt is sampled ``n`` times on each side, each draw an independent
request (its own seed). At generated position k (k = 2.., where speculation acts: the first token comes from the
target's prefill alone) the token ids of the n draws are multinomial counts from the marginal P(x_k | prompt). The
null hypothesis at (prompt, k): both sides' marginals are equal. The test: Pearson's chi-square test of homogeneity
on the 2 × C table of counts (``scipy.stats.chi2_contingency``, no continuity correction), a draw that ended before
k counted as its own category (EOS). Validity needs expected counts of about 5 or more: a token is its own category
only when its expected count on the smaller side, count × min(n₁, n₂) / (n₁ + n₂), is at least ``MIN_EXPECTED``; all
other tokens are pooled into one category, which itself is folded into the smallest kept category when its own
expected count is below ``MIN_EXPECTED``. A position left with fewer than two categories has nothing to compare
(every draw on both sides the same token, or the draws spread too thin for any token to reach 5) and is not tested.

Why per-position marginals suffice for the faults that matter. Lossless speculative sampling means every
conditional P(x_k | x_<k) is the target's; the faults that break it (drafts verified greedily at temperature > 0,
a wrong acceptance ratio, a draft or bonus sampler that ignores temperature, top_p or top_k, a residual
distribution not renormalised) all move probability towards the tokens the draft or the argmax proposes, at every
position where a draft is accepted, from the second token on. Such a shift has the same sign across prefixes, so it
moves the marginal at that position too (it cannot cancel across prefixes as an arbitrary perturbation could). A
fault confined to joint structure with every marginal intact (e.g. swapping which prefix gets which continuation) is
not detected; no sampler bug of that kind is known. Marginals need no tokenizer-level alignment of prefixes and
keep the table small, so a few dozen draws per prompt give a usable test.

Family-wise error. m = prompts × positions tests (those with two or more categories); Holm's step-down over them
keeps the family-wise false-alarm rate at most ``alpha`` for any dependence between the tests: a clean deployment
shows a red position at most ``alpha`` of the time (bench/sampled_lossless.py measures it). Holm's first step is
Bonferroni, so "some position is red" is ``family_p = min(1, m · min p) <= alpha``; the red positions are those whose
Holm-adjusted p is at most ``alpha``.

Power. Green needs the test to have been able to see a fault: ``detectable_shift`` is the smallest probability
mass d moved onto (or off) one token at one position that the test finds with probability 1 − ``POWER_BETA``
(two-sample 2 × 2 chi-square, noncentral chi-square power at the Bonferroni level alpha / m, worst case around
p = 1/2: noncentrality 4·d² / (1/n₁ + 1/n₂)). When it exceeds ``MAX_DETECTABLE_SHIFT`` the run is inconclusive,
saying so; a fault acting at every position is found with far more power than this one-position bound.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

from dspark_ci.ground.stats import scipy_stats

MIN_EXPECTED = 5.0  # Cochran's rule for Pearson's chi-square: expected count per cell
FIRST_POSITION = 2  # the first generated token is the prefill's: speculation acts from the second on
ENDED = -1  # the category of a draw that ended (EOS) before the position
POOLED = -2  # the category of the tokens too rare to stand alone
POWER_BETA = 0.2  # detectable_shift: found with 80 % probability
MAX_DETECTABLE_SHIFT = 0.5  # a test that cannot see half of one token's probability moving is no test: inconclusive

GREEN, RED, INCONCLUSIVE = "green", "red", "inconclusive"

Draws = Sequence[Sequence[int] | None]  # one prompt's draws on one side: token ids, None for a failed request


@dataclass(frozen=True)
class PositionTest:
    """One (prompt, position) test: the pooled table's size, chi-square, p (raw and Holm-adjusted), and the token
    whose share differs most between the sides (``token``: an id, ``ENDED`` or ``POOLED``)."""

    prompt: int
    position: int
    categories: int
    samples: int  # draws on the smaller side
    statistic: float
    dof: int
    p_value: float
    adjusted_p: float
    token: int
    speculative_share: float
    reference_share: float
    token_text: str | None = None  # ``token`` as the server printed it, when the caller numbered printed tokens

    @property
    def token_shown(self) -> str:
        """The token as a person reads it: its printed text when known, else its number."""
        return repr(self.token_text) if self.token_text is not None else str(self.token)

    def to_dict(self) -> dict:
        written = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.token_text is None:  # records written before tokens were printed read back as they were
            del written["token_text"]
        return written


@dataclass(frozen=True)
class Homogeneity:
    """The whole comparison: every test, how many positions could not be tested, the family p and the power."""

    tests: tuple[PositionTest, ...]
    untested: int  # (prompt, position) pairs with fewer than two categories
    samples: int  # draws per prompt on the smaller side (the smallest over prompts)
    family_p: float  # min(1, m · min p): the family's "some position differs" p-value (1.0 without tests)

    def detectable_shift(self, alpha: float) -> float:
        return detectable_shift(self.samples, self.samples, len(self.tests), alpha)

    def red(self, alpha: float) -> tuple[PositionTest, ...]:
        return tuple(test for test in self.tests if test.adjusted_p <= alpha)

    def verdict(self, alpha: float) -> tuple[str, str]:
        """(GREEN | RED | INCONCLUSIVE, why) at family-wise level ``alpha``."""
        return judge(self.family_p, len(self.tests), self.untested, self.samples, alpha)


def judge(family_p: float, tests: int, untested: int, samples: int, alpha: float) -> tuple[str, str]:
    """The verdict from the figures a run records (the gate decides from these alone)."""
    if tests and family_p <= alpha:
        return RED, f"family p {family_p:.2g} <= α {alpha:g} over {tests} tests"
    if not tests:
        return INCONCLUSIVE, (f"no position could be tested ({untested} untested): on every prompt and position the "
                              f"draws fall on one token on both sides, or spread too thin for any token to reach "
                              f"{MIN_EXPECTED:g} expected draws ({samples} per side); sample more "
                              "(accept.lossless_samples)")
    shift = detectable_shift(samples, samples, tests, alpha)
    if shift > MAX_DETECTABLE_SHIFT:
        return INCONCLUSIVE, (f"{samples} draws per side over {tests} tests find only a shift of {_share(shift)} of "
                              f"one token's probability at one position (80 % power at α {alpha:g}): too few to "
                              "call it lossless; sample more (accept.lossless_samples)")
    return GREEN, (f"family p {family_p:.2g} > α {alpha:g} over {tests} tests; a shift of {_share(shift)} at one "
                   "position would be found 80 % of the time")


def _share(value: float) -> str:
    return "all" if math.isinf(value) else f"{value:.0%}"


def compare(speculative: Sequence[Draws], reference: Sequence[Draws], positions: int) -> Homogeneity:
    """Per prompt (same order on both sides) and generated position FIRST_POSITION..``positions``, the test of
    homogeneity; Holm-adjusted over every test made."""
    raw, untested, sizes = [], 0, []
    for prompt, (here, there) in enumerate(zip(speculative, reference, strict=False)):
        here_ok, there_ok = [d for d in here if d is not None], [d for d in there if d is not None]
        sizes.append(min(len(here_ok), len(there_ok)))
        for position in range(FIRST_POSITION, positions + 1):
            test = _position_test(prompt, position, here_ok, there_ok)
            untested += test is None
            raw += [test] if test is not None else []
    adjusted = holm([t.p_value for t in raw])
    tests = tuple(replace(t, adjusted_p=a) for t, a in zip(raw, adjusted, strict=False))
    family_p = min(1.0, len(tests) * min(t.p_value for t in tests)) if tests else 1.0
    return Homogeneity(tests, untested, min(sizes, default=0), family_p)


def _token_at(draw: Sequence[int], position: int) -> int:
    return draw[position - 1] if len(draw) >= position else ENDED


def pooled_counts(here: Sequence[int], there: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """(categories, counts here, counts there) after pooling by the MIN_EXPECTED rule (module docstring)."""
    counts_here, counts_there = Counter(here), Counter(there)
    scale = min(len(here), len(there)) / max(1, len(here) + len(there))
    total = counts_here + counts_there
    kept = sorted((t for t in total if total[t] * scale >= MIN_EXPECTED), key=lambda t: (-total[t], t))
    rest = [t for t in total if t not in kept]
    categories = [[t] for t in kept]
    if rest:
        if sum(total[t] for t in rest) * scale >= MIN_EXPECTED or not categories:
            categories.append(rest)
        else:
            categories[-1] = categories[-1] + rest  # the smallest kept category takes the rare ones
    labels = [group[0] if len(group) == 1 else POOLED for group in categories]
    return (labels, [sum(counts_here[t] for t in group) for group in categories],
            [sum(counts_there[t] for t in group) for group in categories])


def _position_test(prompt: int, position: int, here: Sequence[Sequence[int]],
                   there: Sequence[Sequence[int]]) -> PositionTest | None:
    if not here or not there:
        return None
    labels, row_here, row_there = pooled_counts([_token_at(d, position) for d in here],
                                                [_token_at(d, position) for d in there])
    if len(labels) < 2:
        return None
    result = scipy_stats().chi2_contingency([row_here, row_there], correction=False)
    shares = [(a / len(here), b / len(there)) for a, b in zip(row_here, row_there, strict=False)]
    moved = max(range(len(labels)), key=lambda i: abs(shares[i][0] - shares[i][1]))
    return PositionTest(prompt, position, len(labels), min(len(here), len(there)), float(result.statistic),
                        int(result.dof), float(result.pvalue), float(result.pvalue), labels[moved], *shares[moved])


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the given order: the i-th smallest times (m − i), made monotone."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [1.0] * m, 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def detectable_shift(n_here: int, n_there: int, tests: int, alpha: float, beta: float = POWER_BETA) -> float:
    """The smallest mass d moved on one token at one position that a 2 × 2 chi-square at level alpha / tests finds
    with probability 1 − beta (worst case p = 1/2); inf when even d = 1 is not found so."""
    if not n_here or not n_there or not tests:
        return math.inf
    stats = scipy_stats()
    critical = stats.chi2.isf(alpha / tests, 1)

    def power(d: float) -> float:
        return float(stats.ncx2.sf(critical, 1, 4 * d * d / (1 / n_here + 1 / n_there)))

    if power(1.0) < 1 - beta:
        return math.inf
    from scipy.optimize import brentq

    return float(brentq(lambda d: power(d) - (1 - beta), 1e-9, 1.0))
