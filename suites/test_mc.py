"""Multiple choice by log-likelihood: mc_accuracy, mc_stderr, mc_num_items; records "mc" (one per item), "mc_summary".

Options (suite "mc"): num_items, categories, concurrency, dataset. Accuracy is gated by the run against a baseline
(paired over items, reports/gates.py); this suite only fails when an item could not be scored. Ctrl-C keeps what
was scored: the summary says ``partial: true`` and no mc metric is reported (a partial figure is never gated).
"""

from __future__ import annotations

import pytest
from dspark_ci.suites.config import SuiteInputError
from dspark_ci.suites.mc import item_record, load_items, run_items, select, summarize


@pytest.fixture(scope="module")
def mc_results(request, suite_config, suite_output):
    options = suite_config.suite("mc")
    try:
        data = load_items(options["dataset"])
        items = select(data.items, options["categories"], options["num_items"])
    except SuiteInputError as err:
        pytest.fail(str(err), pytrace=False)
    server = request.getfixturevalue("server")
    results, interrupted = run_items(server, items, options["concurrency"])
    metrics, summary = summarize(results)
    if not interrupted:
        suite_output.add_metrics(metrics)
    suite_output.add_records("mc", [item_record(r) for r in results])
    suite_output.add_records("mc_summary", [{
        **summary, "partial": interrupted, "planned_items": len(items), "categories": options["categories"],
        "dataset": data.describe(), "model": server.model,
    }])
    if interrupted:
        suite_output.warn(f"mc: interrupted after {len(results)} of {len(items)} items; the figure is partial, not "
                          "reported as mc_accuracy nor compared with a baseline")
        raise KeyboardInterrupt
    if summary["boundary_merged"]:
        suite_output.warn(f"mc: {summary['boundary_merged']} continuations were tokenised together with the end of "
                          "their context; each was scored from the first token that differs (suites/mc.py)")
    return results


def test_mc(mc_results):
    failed = [r for r in mc_results if r.error is not None]
    assert not failed, f"{len(failed)} of {len(mc_results)} MC items could not be scored; first: {failed[0].error}"
