"""``dspark-ci baseline record RUN... [--out FILE]``: a reviewable baseline proposal from good runs."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import textwrap
from pathlib import Path

from dspark_ci.ground.errors import BadInput
from dspark_ci.reports.baseline_file import load_baseline
from dspark_ci.reports.baseline_proposal import propose, recorded_gates_text
from dspark_ci.reports.results import load_results, write_text_atomically

EPILOG = textwrap.fill(
    "Reads RUN/results.json of each run (every cell must have passed or been rejected as expected) and proposes, "
    f"per measured cell and metric it measured: {recorded_gates_text()}.", 110) + """
Values are medians over the runs; with two or more runs each carries `noise` (the run-to-run
standard deviation as a fraction of the value), `runs` and `request_noise` (the part of it one boot's
per-request sampling explains), which make its gate a statistical verdict (baselines/README.md). With --out,
GPQA's per-question and MC's per-item outcomes go beside FILE (STEM.CELL.gpqa.json, STEM.CELL.mc.json, named by
`per_question`) for a paired gate.
Record from three or more repeats of the same run. Format: baselines/README.md.

Without --out the proposal is printed. With --out FILE it is written (atomically) and checked by
loading it back; an existing FILE is replaced and the change printed as a diff, so nothing changes
silently. Review it, then commit it.

exit codes: 0 written or printed; 2 bad input (missing run, a run that did not pass, runs of different cells)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    sub = parser.add_subparsers(dest="action", required=True, metavar="record")
    record = sub.add_parser("record", help="propose a baseline file from good runs", description=EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    record.add_argument("runs", metavar="RUN", nargs="+", help="run directories written by `dspark-ci run --out`")
    record.add_argument("--out", metavar="FILE", help="write the proposal here (default: print it)")
    record.add_argument("--description", help="the baseline's description line")


def run(args: argparse.Namespace) -> int:
    if args.out and (Path(args.out).is_dir() or args.out.endswith("/")):
        raise BadInput(f"--out {args.out}", "is a directory", "give the baseline file to write, e.g. --out "
                       f"{Path(args.out) / 'baseline.yaml'}")
    runs = []
    for path in args.runs:
        run_dir = Path(path)
        if not run_dir.is_dir():
            raise BadInput(f"RUN {path}", "no such directory", "give a directory written by `dspark-ci run --out DIR`")
        runs.append((str(run_dir), load_results(run_dir / "results.json")))
    proposal = propose(runs, args.description, per_question_stem=Path(args.out).stem if args.out else None)
    if not args.out:
        print(proposal.text, end="")
        return 0
    out = Path(args.out)
    before = out.read_text(encoding="utf-8") if out.is_file() else None
    for name, questions in proposal.per_question.items():  # first: the baseline names them
        write_text_atomically(out.parent / name, json.dumps(questions, indent=0, sort_keys=True) + "\n")
    _check_reads_back(out, proposal.text, len(runs))
    write_text_atomically(out, proposal.text)
    if before is not None:
        sys.stdout.writelines(difflib.unified_diff(before.splitlines(keepends=True),
                                                   proposal.text.splitlines(keepends=True),
                                                   f"{out} (before)", f"{out} (proposed)"))
    print(f"dspark-ci baseline: {'replaced' if before is not None else 'wrote'} {out}: {proposal.cells} cell(s) "
          f"from {proposal.runs} run(s); review it (git diff) before committing", file=sys.stderr)
    return 0


def _check_reads_back(out: Path, text: str, runs: int) -> None:
    """Never write a baseline our own loader refuses: the proposal is loaded from a staged copy first."""
    staged = out.with_name(f".{out.name}.proposed{out.suffix}")
    write_text_atomically(staged, text)
    try:
        load_baseline(staged)
    except BadInput as err:
        raise BadInput(f"RUN ({runs} given)", f"a baseline from {runs} run(s) would not load: {err.problem}",
                       "record it from 2 or more good runs of the same cells (3 or more recommended): the noise "
                       "a statistical gate needs is measured across runs") from None
    finally:
        staged.unlink(missing_ok=True)
