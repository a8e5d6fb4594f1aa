"""``dspark-ci bisect``: re-run one cell across an ordered range of builds to find the one that regressed.

The search and its statistics are ``dspark_ci.bisection``; this verb turns a build into runs (``dspark-ci run``'s own
pipeline, one run per sample, in ``OUT/runs/``), reads each run's results.json, and writes ``bisect.json`` and
``bisect.md``.
"""

from __future__ import annotations

import argparse
import copy
import fnmatch
import json
import os
import shlex
import sys
from pathlib import Path

from packaging.version import InvalidVersion, Version

from dspark_ci import bisection as search
from dspark_ci.ground import stats
from dspark_ci.ground.errors import BadInput, InfraError
from dspark_ci.ground.run_id import new_run_id
from dspark_ci.matrices import load_cells
from dspark_ci.reports.history_db import HISTORY_ENV
from dspark_ci.reports.metrics import HIGHER, LOWER, METRICS
from dspark_ci.reports.results import load_results, write_text_atomically
from dspark_ci.verbs import run as run_verb

FAILURE = "failure"
EPILOG = """\
The builds, oldest first (the first must be good, the last bad):
  --builds 0.5.24,0.5.25,0.5.26     a list;  --builds-file FILE  one per line (# comments)
  --good 0.5.24 --bad 0.5.31        every patch version between (or the part of --builds between them)
Under the simulator a build is the version it pretends (DSPARK_SIM_VERSION, so DSPARK_SIM_REGRESSION can plant a
regression at one); under real SGLang each build is an image: --launcher docker --image-template
'registry/sglang:dev-{ref}' (commits or tags as builds).

Each build is judged with the gates' statistical verdict (sequential: more runs while inconclusive);
infrastructure failures are retried and never count as bad; the culprit is confirmed against its parent with an
A/B. OUT holds bisect.json, bisect.md, every run (runs/) and their history (history.sqlite).

exit codes: 0 a culprit found and confirmed; 1 none (no regression between the ends, not shown conclusively, or
not confirmed); 2 bad input; 3 infrastructure trouble before anything was measured."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run_verb.add_arguments(parser)  # the same launch options as `dspark-ci run`
    parser.description = "Re-run one cell across an ordered range of builds and name the first bad one."
    parser.epilog = EPILOG
    parser.add_argument("--metric", required=True, metavar="NAME",
                        help=f"the metric to chase (e.g. tpot_ms_median, accept_length), or '{FAILURE}'")
    parser.add_argument("--builds", metavar="A,B,...", help="the builds in order, oldest first")
    parser.add_argument("--builds-file", metavar="FILE", help="the builds in order, one per line")
    parser.add_argument("--good", metavar="BUILD", help="the last known good build")
    parser.add_argument("--bad", metavar="BUILD", help="the first known bad build")
    parser.add_argument("--image-template", metavar="TEMPLATE",
                        help="the image of a build, e.g. 'registry/sglang:dev-{ref}' (docker launcher, real SGLang)")


def run(args: argparse.Namespace) -> int:
    builds = resolve_builds(args)
    chase = chase_of(args.metric)
    cell_id = the_cell(args)
    _check_builds_launchable(args, builds)
    out = Path(args.out or Path("runs") / f"bisect-{new_run_id()}")
    out.mkdir(parents=True, exist_ok=True)
    os.environ[HISTORY_ENV] = str(out / "history.sqlite")  # the bisect's runs stay out of the nightly history
    measure = Measurer(args, cell_id, chase, out)
    print(f"dspark-ci bisect: {cell_id}, {args.metric}, {len(builds)} builds {builds[0]} .. {builds[-1]}; runs in "
          f"{out}/runs/", file=sys.stderr)
    try:
        outcome = search.bisect(builds, chase, measure)
    except search.UnlikeMeasurements as err:
        raise BadInput(f"--cell {cell_id}", str(err), "keep the matrix, suites and simulator settings fixed while "
                       "bisecting; only the build may change") from None
    reproduce = reproduce_command(args, cell_id, outcome)
    report = {"cell": cell_id, **outcome.to_dict(), "reproduce": reproduce}
    write_text_atomically(out / "bisect.json", json.dumps(report, indent=2) + "\n")
    text = markdown(cell_id, outcome, reproduce)
    write_text_atomically(out / "bisect.md", text)
    print(text)
    return 0 if outcome.outcome == search.FOUND and outcome.confirmed else 1


def resolve_builds(args: argparse.Namespace) -> list[str]:
    listed = _listed(args)
    if listed is None:
        if not (args.good and args.bad):
            raise BadInput("--builds", "no builds given", "give --builds A,B,..., --builds-file FILE, or --good and "
                           "--bad versions of one minor release")
        listed = patch_range(args.good, args.bad)
    if args.good or args.bad:
        listed = _between(listed, args.good or listed[0], args.bad or listed[-1])
    if len(listed) < 2 or len(set(listed)) != len(listed):
        raise BadInput("--builds",
                       f"{len(listed)} build(s){', some repeated' if len(set(listed)) != len(listed) else ''}",
                       "give at least two distinct builds, oldest first")
    return listed


def _listed(args: argparse.Namespace) -> list[str] | None:
    if args.builds and args.builds_file:
        raise BadInput("--builds-file", "given together with --builds", "give one of them")
    if args.builds:
        return [b.strip() for b in args.builds.split(",") if b.strip()]
    if args.builds_file:
        try:
            lines = Path(args.builds_file).read_text().splitlines()
        except OSError as err:
            raise BadInput(f"--builds-file {args.builds_file}", f"cannot read it ({err.strerror})",
                           "give a file with one build per line") from None
        return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]
    return None


def _between(listed: list[str], good: str, bad: str) -> list[str]:
    for given, flag in ((good, "--good"), (bad, "--bad")):
        if given not in listed:
            raise BadInput(f"{flag} {given}", "not among the builds", "give one of --builds / --builds-file")
    first, last = listed.index(good), listed.index(bad)
    if first >= last:
        raise BadInput(f"--good {good}", f"comes after --bad {bad} in the builds", "the builds go oldest first")
    return listed[first:last + 1]


def patch_range(good: str, bad: str) -> list[str]:
    """0.5.24 .. 0.5.31 → every patch release between, both included."""
    try:
        first, last = Version(good), Version(bad)
    except InvalidVersion:
        raise BadInput(f"--good {good} --bad {bad}", "not versions", "give --builds for tags or commits") from None
    if first.release[:2] != last.release[:2] or len(first.release) != 3 or len(last.release) != 3 \
            or first.release[2] >= last.release[2]:
        raise BadInput(f"--good {good} --bad {bad}", "not two patch versions of one minor release, oldest first",
                       "give the builds with --builds or --builds-file")
    major, minor = first.release[:2]
    return [f"{major}.{minor}.{patch}" for patch in range(first.release[2], last.release[2] + 1)]


def chase_of(metric: str) -> search.Chase:
    if metric == FAILURE:
        return search.Chase(None)
    better = METRICS[metric].better if metric in METRICS else None
    if better not in (HIGHER, LOWER):
        chaseable = sorted(name for name, m in METRICS.items() if m.better in (HIGHER, LOWER))
        raise BadInput(f"--metric {metric}", "not a metric with a better direction",
                       f"choose {FAILURE} or one of {', '.join(chaseable)}")
    return search.Chase(metric, stats.LOWER if better == LOWER else stats.HIGHER)


def the_cell(args: argparse.Namespace) -> str:
    if len(args.cell) != 1:
        raise BadInput("--cell", "bisect chases exactly one cell", "give one --cell ID (or a glob matching one)")
    ids = [cell.id for cell in load_cells(list(args.matrices))]
    matched = fnmatch.filter(ids, args.cell[0])
    if len(matched) != 1:
        raise BadInput(f"--cell {args.cell[0]}",
                       f"matches {len(matched)} cells{': ' + ', '.join(matched[:5]) if matched else ''}",
                       "give a pattern matching exactly one cell (dspark-ci plan MATRIX --format table lists them)")
    return matched[0]


def _check_builds_launchable(args: argparse.Namespace, builds: list[str]) -> None:
    if args.server == "sim":
        for build in builds:
            try:
                Version(build)
            except InvalidVersion:
                raise BadInput(f"build {build}", "the simulator pretends PEP 440 versions only",
                               "bisect versions under --server sim; tags and commits need --server sglang with "
                               "--image-template") from None
    elif not args.image_template or args.launcher != "docker":
        raise BadInput("--server sglang", "real SGLang builds are images", "give --launcher docker and "
                       "--image-template 'registry/sglang:dev-{ref}'")
    if args.image_template and "{ref}" not in args.image_template:
        raise BadInput(f"--image-template {args.image_template}", "has no {ref}", "e.g. 'registry/sglang:dev-{ref}'")


class Measurer:
    """One run of the cell at one build, through `dspark-ci run`'s pipeline, read back from its results.json."""

    def __init__(self, args: argparse.Namespace, cell_id: str, chase: search.Chase, out: Path):
        self.args, self.cell_id, self.chase, self.out, self.count = args, cell_id, chase, out, 0

    def __call__(self, ref: str) -> search.Sample:
        self.count += 1
        run_dir = self.out / "runs" / f"{self.count:03d}-{ref.replace('/', '_')}"
        args = copy.copy(self.args)
        args.cell, args.out, args.quiet, args.verbose, args.force = [self.cell_id], run_dir, True, False, False
        args.sglang_version = ref if _is_version(ref) else self.args.sglang_version
        if self.args.image_template:
            args.image = self.args.image_template.format(ref=ref)
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(run_dir.with_name(run_dir.name + ".progress.log"), "w", encoding="utf-8") as log:
                run_verb.run_verb(args, stream=log)
        except InfraError as err:
            return self._seen(ref, search.Sample(None, infrastructure=True, where=str(run_dir), note=str(err)))
        cell = next(c for c in load_results(run_dir / "results.json").cells if c.id == self.cell_id)
        value = cell.metrics.get(self.chase.metric) if self.chase.metric else None
        return self._seen(ref, search.Sample(value, failed=cell.status.failing and not cell.infrastructure,
                                             infrastructure=cell.infrastructure, where=str(run_dir),
                                             setup=cell.identity.setup if cell.identity else None,
                                             note=(cell.error or "").splitlines()[0] if cell.error else ""))

    def _seen(self, ref: str, sample: search.Sample) -> search.Sample:
        shown = ("infrastructure failure (retried, not evidence)" if sample.infrastructure
                 else "failed" if sample.failed else "passed") if self.chase.failure or sample.value is None \
            else f"{self.chase.metric} = {sample.value:.4g}"
        print(f"dspark-ci bisect: run {self.count} at {ref}: {shown}", file=sys.stderr, flush=True)
        return sample


def _is_version(ref: str) -> bool:
    try:
        Version(ref)
        return True
    except InvalidVersion:
        return False


def reproduce_command(args: argparse.Namespace, cell_id: str, outcome: search.Outcome) -> str | None:
    """The A/B of the culprit and its parent, as one command."""
    if not (outcome.culprit and outcome.parent):
        return None
    words = ["dspark-ci", "bisect", *args.matrices, "--cell", cell_id, "--metric", args.metric,
             "--builds", f"{outcome.parent},{outcome.culprit}", *run_verb.rerun_options(args)]
    if args.image_template:
        words += ["--image-template", args.image_template]
    # the simulator's settings, a planted regression included, are part of what is reproduced
    env = [f"{k}={os.environ[k]}" for k in sorted(os.environ)
           if k.startswith("DSPARK_SIM_") and k != "DSPARK_SIM_VERSION"]
    return shlex.join([*env, *words])


def markdown(cell_id: str, outcome: search.Outcome, reproduce: str | None) -> str:
    chased = outcome.chase.metric or "failure"
    lines = [f"# Bisect: `{cell_id}`, {chased}", "",
             f"Builds: {len(outcome.builds)}, `{outcome.builds[0]}` (good) .. `{outcome.builds[-1]}` (bad); "
             f"{outcome.runs} runs.", ""]
    if outcome.outcome == search.FOUND and outcome.culprit:
        state = "confirmed by the A/B against its parent" if outcome.confirmed else "NOT confirmed"
        lines += [f"**Culprit: `{outcome.culprit}`** (parent `{outcome.parent}`), {state}; confidence "
                  f"{outcome.confidence:.1%}.", ""]
    else:
        lines += [f"**No culprit**: {outcome.why}", ""]
    if outcome.why and outcome.outcome == search.FOUND:
        lines += [f"Note: {outcome.why}", ""]
    judged = [("good end", outcome.ends[0]), ("bad end", outcome.ends[1])]
    judged += [(f"step {n}", step) for n, step in enumerate(outcome.steps, 1)]
    judged += list(zip(("A/B parent", "A/B culprit"), outcome.ab, strict=False))
    rows = [[what, f"`{j.ref}`", j.judged, str(len(j.values) + j.failures + j.infra_failures),
             _values(j), (j.verdict.describe() if j.verdict else ""), j.how] for what, j in judged]
    lines += ["| | build | judged | runs | values | verdict | evidence |", "|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    if reproduce:
        lines += ["", "Reproduce the A/B:", "", f"    {reproduce}"]
    return "\n".join(lines) + "\n"


def _values(judged: search.Judged) -> str:
    extra = [f"{judged.failures} failed"] * bool(judged.failures) + [f"{judged.infra_failures} infra"] * bool(
        judged.infra_failures)
    if judged.values and any(judged.values):
        shown = sorted(judged.values)
        extra.insert(0, f"median {shown[len(shown) // 2]:.4g} ({shown[0]:.4g}..{shown[-1]:.4g})")
    elif judged.values:
        extra.insert(0, f"{len(judged.values)} passed")
    return ", ".join(extra)

