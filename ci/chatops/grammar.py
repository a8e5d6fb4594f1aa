"""ChatOps commands: the first line of a PR comment, read with a strict allow-list.

The grammar of each command (``no_arguments``, ``test_arguments``, ``bisect_arguments``); which commands exist,
with their grammar, permission and handler, is one row each in ``dspark_ci.ci.chatops.handle.COMMANDS``. Anything else
is refused. Test specs of ``/rerun-test`` may hold only
characters a file name, a ``::Class.test`` selector or a ``*``/``?`` wildcard needs: a test
command ends up in a shell on a GPU runner, so a spec that could mean anything else never gets
past this module.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass

TAG_RUN_CI_LABEL = "/tag-run-ci-label"
TAG_AND_RERUN_CI = "/tag-and-rerun-ci"
RERUN_FAILED_CI = "/rerun-failed-ci"
RERUN_TEST = "/rerun-test"
BISECT = "/bisect"

# The one cap on what a comment can start: test files and matrix cells together (and so also the specs,
# globs included, that name them). Each one is a GPU job; more in one comment is a paste accident.
MAX_STARTS = 20
MAX_SPECS = MAX_STARTS
MAX_SPEC_CHARS = 200  # a longer spec is no file name anyone types; it could only be an attack on the matcher
MAX_WILDCARDS = 4  # `*`/`?` per spec: matching cost grows with each one
MAX_RECURSIVE = 1  # `**` path segments per spec
CELL_PREFIX = "cell:"  # `cell:PATTERN` reruns matrix cells, not SGLang test files
TRIALS_FLAG = "--trials"  # `/rerun-test cell:ID --trials N`: N boots, the statistical verdict with its interval
MAX_TRIALS = 16  # boots of one rerun: GPU hours, not a loop
_BUILD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # a version, tag or commit: nothing a shell would read
_METRIC = re.compile(r"[a-z][a-z0-9_]{0,63}")
BISECT_USAGE = ("/bisect CELL METRIC GOOD..BAD, "
                "e.g. /bisect dsv4-flash-tp8-a2a-none-dspark-b7-cuda tpot_ms_median 0.5.24..0.5.31")

_FILE_CHARS = re.compile(r"[A-Za-z0-9_./*?-]+")
_SELECTOR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")
WILDCARDS = "*?"

# The line a reply shows per test (dspark_ci.ci.chatops.reply), pasted back after /rerun-test: these words open it.
PASTED_OPENINGS = (("cd", "test/", "&&", "python3"), ("cd", "test", "&&", "python3"))

RERUN_TEST_EXAMPLES = (
    "/rerun-test test/registered/spec/test_dflash.py::TestDFlash.test_gsm8k",
    "/rerun-test registered/spec/test_dflash.py",
    "/rerun-test test_dflash.py",
    "/rerun-test test_dflash_*.py",
    "/rerun-test cell:dsv4-flash-tp8-*",
)


class CommentRejected(Exception):
    """The comment is not a command we run.

    ``refusals``: (token at fault or None for the whole line, problem); ``command``: the command
    name when the line started with one.
    """

    def __init__(self, refusals: list[tuple[str | None, str]], command: str | None = None):
        self.refusals, self.command = refusals, command
        super().__init__("; ".join(f"{spec}: {why}" if spec else why for spec, why in refusals))


class NotACommand(CommentRejected):
    """The first line is not one of our commands. ``suggestion``: the command it nearly is, or None
    (then nothing is replied: a bot must not answer, let alone echo, every comment starting with /)."""

    def __init__(self, suggestion: str | None, names: Sequence[str] = ()):
        self.suggestion = suggestion
        text = (f"not a command; did you mean {suggestion}? The first line must be one of "
                + ", ".join(names)) if suggestion else "not a command (no reply)"
        super().__init__([(None, text)])


class SpecRejected(Exception):
    def __init__(self, spec: str, problem: str):
        self.spec, self.problem = spec, problem
        super().__init__(problem)


@dataclass(frozen=True)
class TestSpec:
    text: str  # as the user wrote it
    file_part: str  # before "::"; for a cell spec, the cell id or pattern
    selector: str | None  # "TestClass" or "TestClass.test_method"
    cell: bool = False  # a matrix cell id (or `cell:PATTERN`), not a test file

    @property
    def has_wildcard(self) -> bool:
        return any(c in self.file_part for c in WILDCARDS)


@dataclass(frozen=True)
class BisectRequest:
    cell: str  # a cell id or a glob matching one
    metric: str  # a metric name, or "failure"
    good: str
    bad: str


@dataclass(frozen=True)
class Command:
    name: str  # one of dspark_ci.ci.chatops.handle.COMMANDS
    specs: tuple[TestSpec, ...] = ()
    trials: int | None = None  # /rerun-test cell:... --trials N
    bisect: BisectRequest | None = None


def first_line(comment: str) -> str:
    stripped = comment.strip()
    return stripped.splitlines()[0].strip() if stripped else ""


def split_command(comment: str, names: Sequence[str]) -> tuple[str, list[str]]:
    """The command name (one of ``names``) and its arguments (unchecked); raises NotACommand for anything else."""
    tokens = first_line(comment).split()
    if not tokens or tokens[0] not in names:
        word = tokens[0][:40] if tokens else ""
        near = difflib.get_close_matches(word.lower(), names, n=1, cutoff=0.75) if word.startswith("/") else []
        raise NotACommand(near[0] if near else None, names)
    return tokens[0], tokens[1:]


def no_arguments(name: str, args: list[str]) -> Command:
    """The grammar of a command that takes nothing after its name."""
    if args:
        raise CommentRejected([(None, f"{name} takes no arguments")], name)
    return Command(name)


def bisect_arguments(name: str, args: list[str]) -> Command:
    """``CELL METRIC GOOD..BAD``."""
    return Command(name, bisect=_bisect_request(name, args))


def test_arguments(name: str, args: list[str]) -> Command:
    """Test files and matrix cells (``cell:ID``), at most MAX_SPECS, and ``--trials N`` for cells."""
    args, trials = _trials(name, _unpasted(name, args))
    if not args:
        raise CommentRejected([(None, f"{name} needs at least one test, e.g. "
                                + "; ".join(RERUN_TEST_EXAMPLES))], name)
    if len(args) > MAX_SPECS:
        raise CommentRejected([(None, f"{name} takes at most {MAX_SPECS} tests per comment "
                                      f"(got {len(args)})")], name)
    specs: list[TestSpec] = []
    refusals: list[tuple[str | None, str]] = []
    for arg in args:
        try:
            specs.append(parse_spec(arg))
        except SpecRejected as err:
            refusals.append((err.spec, err.problem))
    if refusals:
        raise CommentRejected(refusals, name)
    if trials is not None and not all(spec.cell for spec in specs):
        raise CommentRejected([(TRIALS_FLAG, "applies to matrix cells only (cell:ID): a test file runs once")], name)
    return Command(name, tuple(specs), trials=trials)


def _unpasted(name: str, args: list[str]) -> list[str]:
    """The bot's own line pasted back (``cd test/ && python3 FILE [Class.test]``) as the one spec it names."""
    opening = next((words for words in PASTED_OPENINGS if tuple(args[:len(words)]) == words), None)
    if opening is None:
        return args
    rest = args[len(opening):]
    if len(rest) == 1 or (len(rest) == 2 and _SELECTOR.fullmatch(rest[1])):
        return ["::".join(rest)]
    raise CommentRejected([(None, f"a pasted line runs one test: {' '.join(opening)} FILE [TestClass.test_method]; "
                                  "or give the files themselves: " + "; ".join(RERUN_TEST_EXAMPLES))], name)


def _trials(name: str, args: list[str]) -> tuple[list[str], int | None]:
    """``args`` without ``--trials N``, and N (2..MAX_TRIALS)."""
    if TRIALS_FLAG not in args:
        return args, None
    at = args.index(TRIALS_FLAG)
    value = args[at + 1] if at + 1 < len(args) else ""
    if not value.isdigit() or not 2 <= int(value) <= MAX_TRIALS or args.count(TRIALS_FLAG) > 1:
        raise CommentRejected([(TRIALS_FLAG, f"takes one number of boots from 2 to {MAX_TRIALS}, "
                                             "e.g. /rerun-test cell:ID --trials 4")], name)
    return args[:at] + args[at + 2:], int(value)


def _bisect_request(name: str, args: list[str]) -> BisectRequest:
    if len(args) != 3 or args[2].count("..") != 1:
        raise CommentRejected([(None, f"usage: {BISECT_USAGE}")], name)
    cell, metric, span = args
    good, bad = span.split("..")
    refusals: list[tuple[str | None, str]] = []
    try:
        _cell_spec(CELL_PREFIX + cell)
    except SpecRejected as err:
        refusals.append((cell, err.problem))
    if not _METRIC.fullmatch(metric):
        refusals.append((metric, "a metric name is lower-case letters, digits and _ (or failure)"))
    for build in (good, bad):
        if not _BUILD.fullmatch(build):
            refusals.append((build or "(empty)", "a build is a version, tag or commit: letters, digits, . _ -"))
    if refusals:
        raise CommentRejected(refusals, name)
    return BisectRequest(cell, metric, good, bad)


def parse_spec(text: str) -> TestSpec:
    if len(text) > MAX_SPEC_CHARS:
        raise SpecRejected(text[:40] + "...", f"is {len(text)} characters long; at most {MAX_SPEC_CHARS} "
                                              "are accepted")
    if text.startswith(CELL_PREFIX):
        return _cell_spec(text)
    file_part, sep, selector = text.partition("::")
    selector = selector.replace("::", ".", 1)  # pytest's file::Class::test names what unittest's Class.test does
    bad = sorted({c for c in file_part + selector.replace(":", "") if not _FILE_CHARS.fullmatch(c)})
    if bad:
        shown = " ".join(c if c.isprintable() else repr(c) for c in bad)
        raise SpecRejected(text, f"contains {shown}: only letters, digits, _ - . / * ? and one "
                                 "::Class.test selector are allowed")
    if file_part.startswith("/"):
        raise SpecRejected(text, "absolute paths are not allowed: give a path under test/registered/ "
                                 "or a bare file name")
    if ".." in file_part:
        raise SpecRejected(text, ".. is not allowed: give a path under test/registered/ or a bare file name")
    if not file_part:
        raise SpecRejected(text, "no test file before ::")
    if sep and not _SELECTOR.fullmatch(selector):
        raise SpecRejected(text, "after :: give TestClass or TestClass.test_method (or pytest's "
                                 "TestClass::test_method; no wildcards)")
    _check_complexity(text, file_part)
    return TestSpec(text=text, file_part=file_part, selector=selector if sep else None,
                    cell=not sep and "/" not in file_part and not file_part.endswith(".py"))


def _cell_spec(text: str) -> TestSpec:
    pattern = text[len(CELL_PREFIX):]
    if not pattern or not _FILE_CHARS.fullmatch(pattern) or "/" in pattern:
        raise SpecRejected(text, "after cell: give a cell id or a glob of cell ids (letters, digits, _ - . * ?)")
    _check_complexity(text, pattern)
    return TestSpec(text=text, file_part=pattern, selector=None, cell=True)


def _check_complexity(text: str, pattern: str) -> None:
    wildcards = sum(pattern.count(c) for c in WILDCARDS)
    if wildcards > MAX_WILDCARDS:
        raise SpecRejected(text, f"has {wildcards} wildcards; at most {MAX_WILDCARDS} are accepted")
    segments = pattern.split("/")
    if sum(segment == "**" for segment in segments) > MAX_RECURSIVE:
        raise SpecRejected(text, f"at most {MAX_RECURSIVE} ** segment is accepted")
    if any("**" in segment and segment != "**" for segment in segments):
        raise SpecRejected(text, "** must be a whole path segment (registered/**/test_x.py)")
