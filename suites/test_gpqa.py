"""GPQA accuracy: gpqa_accuracy, gpqa_stderr, gpqa_num_questions, gpqa_repeats; records "gpqa", "gpqa_summary".

Options (suite "gpqa"): num_questions, repeats, concurrency, max_tokens, temperature, extractor,
dataset, thinking, chat_template_kwargs. Accuracy is gated by the run against a baseline; this
suite only fails when the server could not answer.
"""

from __future__ import annotations

import pytest

from suites.config import SuiteInputError
from suites.gpqa import EXTRACTORS, GpqaSettings, build_examples, load_gpqa, run_examples, sample_record, summarize

# More unparseable answers than this usually means truncation (max_tokens too small) or a broken model.
UNANSWERED_WARN_FRACTION = 0.2


@pytest.fixture(scope="module")
def gpqa_results(server, suite_config, suite_output):
    options = suite_config.suite("gpqa")
    try:
        dataset = load_gpqa(options["dataset"], suite_config.cache_dir)
        examples = build_examples(dataset.rows, options["num_questions"], options["repeats"])
    except SuiteInputError as err:
        pytest.fail(str(err), pytrace=False)
    settings = GpqaSettings.from_options(options)
    results = run_examples(server, examples, settings)

    num_questions = len(examples) // options["repeats"]
    metrics, summary = summarize(results, num_questions, options["repeats"])
    suite_output.add_metrics(metrics)
    suite_output.add_records("gpqa", [sample_record(r) for r in results])
    suite_output.add_records("gpqa_summary", [{
        **summary, "dataset": dataset.describe(), "extractor": settings.extractor,
        "regex": EXTRACTORS[settings.extractor], "temperature": settings.temperature,
        "max_tokens": settings.max_tokens, "chat_template_kwargs": settings.chat_template_kwargs,
        "model": server.model,
    }])
    if summary["unanswered"] > UNANSWERED_WARN_FRACTION * len(results):
        suite_output.warn(f"gpqa: {summary['unanswered']} of {len(results)} responses have no "
                          f"'Answer: X' line ({summary['truncated']} hit max_tokens={settings.max_tokens})")
    return results


def test_gpqa(gpqa_results):
    failed = [r for r in gpqa_results if r.error is not None]
    assert not failed, f"{len(failed)} of {len(gpqa_results)} GPQA requests failed; first: {failed[0].error}"
