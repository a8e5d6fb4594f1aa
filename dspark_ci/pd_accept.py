"""Acceptance under PD against the colocated baseline of the same decode configuration: an equivalence test
(two one-sided Welch t-tests, TOST), not a floor. vLLM checks PD + speculative acceptance against a standalone
server the same way; a transfer that hands decode the wrong hidden state (sglang#7242) leaves the server healthy
and the text right, and shows only here.

Per request, accept length = completion tokens / verify steps, on both deployments (same prompts, same API).
Equivalent when the 90 % Welch interval of the difference (PD − colocated), relative to the colocated mean, lies
inside ±MARGIN; regressed when the difference is significant (the 90 % interval excludes 0) and its estimate is
beyond the margin; otherwise inconclusive (too few requests to tell), never a coin flip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from dspark_ci.ground import stats
from dspark_ci.ground.records import GateResult
from dspark_ci.suite_runner import SuiteOutcome

METRIC = "accept_length_pd_vs_colocated"
MARGIN = 0.10  # relative: PD's acceptance within ±10 % of colocated counts as the same
ALPHA = 0.05  # each one-sided test (a 90 % interval)
PD_BOOT_TIMEOUT_S = 600.0
RECORD = "accept_equivalence"


def per_request_lengths(records: Sequence[dict]) -> list[float]:
    return [r["completion_tokens"] / r["spec_verify_ct"] for r in records
            if r.get("spec_verify_ct") and not r.get("error")]


def equivalence(pd: Sequence[float], colocated: Sequence[float], margin: float = MARGIN) -> GateResult:
    if len(pd) < 2 or len(colocated) < 2:
        return GateResult(METRIC, "within", margin, None, False)
    base = sum(colocated) / len(colocated)
    test = stats.scipy_stats().ttest_ind(pd, colocated, equal_var=False)
    interval = test.confidence_interval(confidence_level=1 - 2 * ALPHA)
    effect = (sum(pd) / len(pd) - base) / base
    low, high = interval.low / base, interval.high / base
    if -margin <= low and high <= margin:
        verdict = stats.PASSED
    elif (high < 0 or low > 0) and abs(effect) > margin:
        verdict = stats.REGRESSED
    else:
        verdict = stats.INCONCLUSIVE
    statistic = stats.Verdict(verdict, effect, low, high, -margin, "relative",
                              "TOST: two one-sided Welch t-tests on per-request accept length, PD vs colocated",
                              ALPHA, ALPHA, len(pd))
    return GateResult(METRIC, "within", margin, round(effect, 4), verdict == stats.PASSED, statistic)


def with_colocated_accept(outcome: SuiteOutcome, colocated: SuiteOutcome) -> SuiteOutcome:
    """The PD outcome with the colocated baseline's acceptance and the equivalence decision in its records."""
    pd_lengths = per_request_lengths(outcome.records.get("accept", []))
    base_lengths = per_request_lengths(colocated.records.get("accept", []))
    gate = equivalence(pd_lengths, base_lengths)
    records = {**outcome.records, "accept_colocated": colocated.records.get("accept", []),
               RECORD: [{**gate.to_dict(), "pd_requests": len(pd_lengths), "colocated_requests": len(base_lengths),
                         "colocated_accept_length": colocated.metrics.get("accept_length")}]}
    warnings = list(outcome.warnings) + [f"colocated baseline: {w}" for w in colocated.warnings]
    if colocated.stopped_by is not None:
        warnings.append(f"colocated baseline stopped: {colocated.stopped_by}")
    return replace(outcome, records=records, warnings=warnings)


def equivalence_gates(records: dict) -> tuple[GateResult, ...]:
    """The equivalence gate recorded by ``with_colocated_accept`` (none for a colocated cell)."""
    gates = []
    for entry in records.get(RECORD, []):
        if entry.get("verdict") is None:
            continue
        statistic = None
        if "effect" in entry:
            statistic = stats.Verdict(entry["verdict"], entry["effect"], entry["interval"][0], entry["interval"][1],
                                      entry["tolerance"], entry["scale"], entry["test"], entry["alpha"],
                                      entry["beta"], entry["samples"])
        gates.append(GateResult(METRIC, "within", entry["threshold"], entry["value"], entry["passed"], statistic))
    return tuple(gates)
