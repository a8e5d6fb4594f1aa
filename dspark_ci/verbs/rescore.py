"""``dspark-ci rescore RUN_DIR --scorer X``: score a run's recorded GPQA responses again with another scorer.

Offline: nothing is asked of any server. Each cell's full responses come from ``logs/<cell>/suites.json``
(or, when the suites were killed before writing it, the streamed ``logs/<cell>/gpqa-samples.jsonl``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dspark_ci.ground.errors import BadInput
from dspark_ci.suites import sgl_eval_scorer
from dspark_ci.suites.config import SuiteInputError
from dspark_ci.suites.gpqa import SCORERS, SampleResult, rescored, sample_from_record, summarize
from dspark_ci.suites.output import GPQA_SAMPLES_FILE

EPILOG = """\
Rescoring changes the extraction and the aggregation only: the prompt (and so the letter order) stays the
one the run sent, its own scorer's. Two figures that differ on the same responses mean the scorers differ,
not the model. Prints one line per cell with a GPQA figure: the samples, the figure as run (its scorer) and
the figure rescored (pass@1 averaged over the repeats ± its standard error clustered by question; the no-answer
rate).
Writes nothing. Rescoring with sgl-eval needs the sgl-eval package (pip install -e '.[sgl-eval]').

exit codes: 0 printed; 1 some cell's responses could not be rescored (recorded before full responses were
kept); 2 bad input (no such directory, no GPQA samples in it, sgl-eval not installed)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `dspark-ci run --out`")
    parser.add_argument("--scorer", required=True, choices=SCORERS, help="the scorer to rescore with")


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise BadInput(f"RUN_DIR {args.run_dir}", "no such directory",
                       "give a directory written by `dspark-ci run --out DIR`")
    recorded = {cell_dir.name: _recorded(cell_dir) for cell_dir in sorted((run_dir / "logs").glob("*/"))}
    cells = {name: found for name, found in recorded.items() if found is not None}
    if not cells:
        raise BadInput(f"RUN_DIR {args.run_dir}", "no GPQA samples recorded in logs/*/",
                       "rescore a run whose cells ran the gpqa suite")
    if args.scorer == "sgl-eval":
        try:
            sgl_eval_scorer.modules()
        except SuiteInputError as err:
            raise BadInput(f"--scorer {args.scorer}", str(err)) from None
    width = max(len(name) for name in cells)
    print(f"{'cell':{width}}  {'samples':>9}  {'as run':40}  rescored")
    unscorable = 0
    for name, (samples, summary, source) in cells.items():
        if not any(s.response for s in samples):
            print(f"{name:{width}}  cannot rescore: {source} holds only the end of each response (recorded "
                  "before full responses were kept); run the cell again")
            unscorable += 1
            continue
        try:
            print(_line(name, width, samples, summary, args.scorer))
        except SuiteInputError as err:
            raise BadInput(f"--scorer {args.scorer}", str(err)) from None
    print("(the prompt stays the one each run sent: rescoring changes extraction and aggregation only)")
    return 1 if unscorable else 0


def _recorded(cell_dir: Path) -> tuple[list[SampleResult], dict, str] | None:
    """(samples, the gpqa summary record, where they were read) of one cell, or None without GPQA samples."""
    suites_json = cell_dir / "suites.json"
    try:
        records = json.loads(suites_json.read_text()).get("records", {})
    except (OSError, ValueError):
        records = {}
    summary = (records.get("gpqa_summary") or [{}])[-1]
    if records.get("gpqa"):
        return [sample_from_record(r) for r in records["gpqa"]], summary, str(suites_json)
    streamed = cell_dir / GPQA_SAMPLES_FILE
    if streamed.is_file():
        samples = [sample_from_record(json.loads(line)) for line in streamed.read_text().splitlines() if line.strip()]
        return (samples, summary, str(streamed)) if samples else None
    return None


def _line(name: str, width: int, samples: list[SampleResult], summary: dict, scorer: str) -> str:
    repeats = max(s.repeat for s in samples) + 1
    questions = len({s.question_id for s in samples})
    original = summary.get("scorer") or samples[0].scorer
    partial = " (partial)" if summary.get("partial") else ""
    as_run = _recorded_figure(summary, original) or _figure(samples, questions, repeats, original)
    again = _figure([rescored(s, scorer) for s in samples], questions, repeats, scorer)
    size = f"{questions}" if repeats == 1 else f"{questions}×{repeats}"
    return f"{name:{width}}  {size:>9}  {as_run:40}  {again}{partial}"


def _recorded_figure(summary: dict, scorer: str) -> str | None:
    """The figure the run itself recorded (no need for its scorer's package to show it)."""
    if summary.get("accuracy") is None or "aggregate" not in summary:
        return None
    stderr = summary.get("stderr_clustered_by_question")
    error_bar = f" ± {stderr:.1%}" if isinstance(stderr, float) and stderr == stderr else ""
    return f"{summary['accuracy']:.1%}{error_bar} {scorer} (no answer {summary['aggregate'].get('no_answer', 0):.0%})"


def _figure(samples: list[SampleResult], questions: int, repeats: int, scorer: str) -> str:
    metrics, summary = summarize(samples, questions, repeats, scorer)
    aggregate = summary["aggregate"]
    stderr = metrics["gpqa_stderr"]
    error_bar = f" ± {stderr:.1%}" if stderr == stderr else ""  # NaN with one sample
    return f"{metrics['gpqa_accuracy']:.1%}{error_bar} {scorer} (no answer {aggregate.get('no_answer', 0):.0%})"
