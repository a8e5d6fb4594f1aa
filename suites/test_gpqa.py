"""GPQA accuracy: gpqa_accuracy, gpqa_stderr, gpqa_num_questions, gpqa_repeats; records "gpqa", "gpqa_summary".

Options (suite "gpqa"): num_questions, repeats, concurrency, max_tokens, temperature, scorer (simple-evals,
sglang, sgl-eval), extractor (older: openai = scorer simple-evals), dataset, thinking, chat_template_kwargs.
Accuracy is gated by the run against a baseline; this suite only fails when the server could not answer.
Each sample is streamed to ``gpqa-samples.jsonl`` beside --dspark-out as it is scored. Ctrl-C keeps what was
scored: the summary says ``partial: true`` and no gpqa metric is reported (a partial figure is never gated).
"""

from __future__ import annotations

import pytest
from dspark_ci.ground.suites import scorer_cli_differences
from dspark_ci.suites import sgl_eval_scorer
from dspark_ci.suites.config import SuiteInputError
from dspark_ci.suites.gpqa import (
    EXTRACTORS,
    GpqaSettings,
    SampleStream,
    build_examples,
    load_gpqa,
    run_examples,
    sample_record,
    summarize,
)
from dspark_ci.suites.output import GPQA_SAMPLES_FILE

# More responses without an answer than this usually means truncation (max_tokens too small) or a broken
# model (sgl-eval warns from the same 5 %).
UNANSWERED_WARN_FRACTION = 0.05


@pytest.fixture(scope="module")
def gpqa_results(request, suite_config, suite_output):
    options = suite_config.suite("gpqa")
    settings = GpqaSettings.from_options(options)
    try:
        dataset = load_gpqa(options["dataset"], suite_config.cache_dir)
        examples = build_examples(dataset.rows, options["num_questions"], options["repeats"], settings.scorer)
        scorer_version = sgl_eval_scorer.version() if settings.scorer == "sgl-eval" else None
    except SuiteInputError as err:
        pytest.fail(str(err), pytrace=False)
    server = request.getfixturevalue("server")  # after the inputs: a missing package is said before any connection
    out_path = suite_config.out_path
    stream = SampleStream(out_path.with_name(GPQA_SAMPLES_FILE) if out_path else None, planned=len(examples))
    try:
        results, interrupted = run_examples(server, examples, settings, on_result=stream)
    finally:
        stream.close()

    differences = scorer_cli_differences(options)
    num_questions = len(examples) // options["repeats"]
    metrics, summary = summarize(results, num_questions, options["repeats"], settings.scorer)
    if not interrupted:
        suite_output.add_metrics(metrics)
    suite_output.add_records("gpqa", [sample_record(r) for r in results])
    suite_output.add_records("gpqa_summary", [{
        **summary, "partial": interrupted, "planned_samples": len(examples),
        "accuracy": metrics["gpqa_accuracy"] if results else None,
        "samples_file": str(stream.path) if stream.path else None,
        "dataset": dataset.describe(), "extractor": settings.extractor,
        "regex": EXTRACTORS.get(settings.extractor or ""), "sgl_eval_version": scorer_version,
        "sgl_eval_sampling": sgl_eval_scorer.sampling() if scorer_version else None,
        "temperature": settings.temperature, "max_tokens": settings.max_tokens,
        "chat_template_kwargs": settings.chat_template_kwargs, "model": server.model,
        "cli_differences": differences,
    }])
    if differences:
        said = ", ".join(f"{key} {_shown(d['ours'])} (sgl-eval: {_shown(d['sgl_eval'])})"
                         for key, d in differences.items())
        suite_output.warn(f"gpqa: scored as sgl-eval, but sent unlike `sgl-eval run gpqa`: {said}; the CLI's figure "
                          "for this server may differ")
    if interrupted:
        figure = f"{metrics['gpqa_accuracy']:.1%}" if results else "no figure"
        suite_output.warn(f"gpqa: interrupted after {len(results)} of {len(examples)} samples; {figure} is "
                          f"partial (scorer {settings.scorer}), not reported as gpqa_accuracy nor compared "
                          "with a baseline")
        raise KeyboardInterrupt
    if results and summary["unanswered"] > UNANSWERED_WARN_FRACTION * len(results):
        hint = (f"{summary['truncated']} hit max_tokens={settings.max_tokens}: raise gpqa.max_tokens "
                "(thinking models need tens of thousands)" if summary["truncated"]
                else "read a few responses in the gpqa records: the model may not follow the answer format")
        suite_output.warn(f"gpqa: {summary['unanswered']} of {len(results)} responses "
                          f"({summary['unanswered'] / len(results):.0%}) have no answer the {settings.scorer} "
                          f"scorer can extract; {hint}")
    return results


def test_gpqa(gpqa_results):
    failed = [r for r in gpqa_results if r.error is not None]
    assert not failed, f"{len(failed)} of {len(gpqa_results)} GPQA requests failed; first: {failed[0].error}"


def _shown(value) -> str:
    return "none" if value is None else str(value)
