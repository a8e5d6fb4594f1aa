"""``/rerun-test`` specs -> test files under ``<repo-root>/test/registered/``, each with its runner.

A spec is a bare file name (searched everywhere under ``test/registered/``), a path starting
``registered/`` or ``test/registered/``, either one optionally with ``*``/``?`` wildcards (and one
``**`` segment in a path), and an optional ``::TestClass[.test_method]`` selector. A bare name
without wildcards that matches several files is refused: running one of them would be a guess.

The tree comes from an unreviewed PR, so resolution cannot escape or explode:
- ``test/`` and ``test/registered/`` must be real directories, and the tree is walked once without
  following symlinks: a symlinked directory is never entered, a symlinked test file is refused when
  a spec matches it (its registration would otherwise come from outside the repository);
- the walk stops at ``MAX_TREE_ENTRIES`` entries or when the time budget (``SEARCH_SECONDS``) is spent;
  patterns are matched segment by segment with ``fnmatch`` (never handed to the file system), their
  complexity bounded by ``dspark_ci.ci.chatops.grammar``;
- every spec is matched before any file is read, and matching stops as soon as the comment's cap
  (``dspark_ci.ci.chatops.grammar.MAX_STARTS``, shared with matrix cells) is passed: a glob over a huge tree costs
  one pass over the names, never a parse per match;
- a matched file whose path holds anything outside ``SAFE_PATH`` is refused: the rerun workflow
  gets exactly the names resolved here, so a space, ``;`` or a newline can never change its command;
- registrations are read with a bounded read (``dspark_ci.ci.chatops.sglang_registrations``).
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from dspark_ci.ci.chatops.grammar import MAX_STARTS, TestSpec
from dspark_ci.ci.chatops.sglang_registrations import Registration, RegistrationError, chosen_registration
from dspark_ci.ci.chatops.text import clip

TEST_FILE_PATTERN = "test_*.py"
MAX_TREE_ENTRIES = 50_000  # SGLang's test/registered holds ~1,000 entries
SEARCH_SECONDS = 1.5  # walking and matching together; a tree that needs more is refused, not waited for
MAX_SUGGESTION_NAMES = 2_000  # "Closest:" is looked for among at most this many names
MAX_DEPTH = 12
SAFE_PATH = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_./-]*")  # what a dispatched path may hold
ROOT_FIX = "the PR's test tree must be real directories, not symlinks"


class SpecRefused(Exception):
    """One spec that cannot be run; ``str()`` is the reply text after ``⛔ <spec>: ``."""


class TreeRefused(Exception):
    """The whole test tree cannot be used (symlinked root, too large, too slow); ``str()`` says why."""


class Deadline:
    """The time budget of one comment's search."""

    def __init__(self, seconds: float = SEARCH_SECONDS):
        self.seconds, self.ends = seconds, time.monotonic() + seconds

    def check(self) -> None:
        if time.monotonic() > self.ends:
            raise TreeRefused(f"test/registered/ could not be searched within {self.seconds:g} s: "
                              "give full paths instead of wildcards")


@dataclass(frozen=True)
class ResolvedTest:
    spec: str  # as the user wrote it
    path: str  # relative to test/, e.g. "registered/spec/test_dflash.py"
    selector: str | None
    registration: Registration

    @property
    def argv(self) -> list[str]:
        """What runs inside test/ after ``python3`` (SGLang's unittest-file convention)."""
        return [self.path, self.selector] if self.selector else [self.path]

    @property
    def command(self) -> str:
        return " ".join(self.argv)

    @property
    def runner(self) -> str:
        return self.registration.runner


@dataclass(frozen=True)
class TestTree:
    """Every regular file under test/registered/, as paths relative to test/ (never followed)."""

    test_dir: Path
    files: tuple[str, ...]
    symlinks: frozenset[str]  # files and directories that are symlinks (relative to test/)
    test_files: tuple[str, ...] = ()  # the files named test_*.py


def scan_tree(repo_root: Path, deadline: Deadline | None = None) -> TestTree:
    """Walk test/registered/ once; raises TreeRefused for a symlinked root, a tree too large or too slow."""
    deadline = deadline or Deadline()
    test_dir = repo_root / "test"
    for directory in (test_dir, test_dir / "registered"):
        try:
            mode = directory.lstat().st_mode
        except OSError:
            raise TreeRefused(f"{clip(directory.relative_to(repo_root).as_posix())}/ does not exist") from None
        if stat.S_ISLNK(mode):
            raise TreeRefused(f"{directory.relative_to(repo_root).as_posix()} is a symlink: refused ({ROOT_FIX})")
        if not stat.S_ISDIR(mode):
            raise TreeRefused(f"{directory.relative_to(repo_root).as_posix()} is not a directory")
    files: list[str] = []
    symlinks: set[str] = set()
    entries = 0
    for current, dirs, names in os.walk(test_dir / "registered", followlinks=False):
        relative = Path(current).relative_to(test_dir).as_posix()
        entries += len(dirs) + len(names)
        if entries > MAX_TREE_ENTRIES:
            raise TreeRefused(f"test/registered/ holds more than {MAX_TREE_ENTRIES} entries: not searched")
        deadline.check()
        if relative.count("/") >= MAX_DEPTH:
            dirs[:] = []
        for name in list(dirs):
            if os.path.islink(os.path.join(current, name)):
                symlinks.add(f"{relative}/{name}")
        for name in names:
            path = os.path.join(current, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                symlinks.add(f"{relative}/{name}")
            elif stat.S_ISREG(mode):
                files.append(f"{relative}/{name}")
    files.sort()
    tests = tuple(f for f in files if fnmatch.fnmatchcase(f.rsplit("/", 1)[-1], TEST_FILE_PATTERN))
    return TestTree(test_dir, tuple(files), frozenset(symlinks), tests)


def resolve_specs(specs: tuple[TestSpec, ...], tree: TestTree, cap: int = MAX_STARTS,
                  deadline: Deadline | None = None) -> tuple[list[ResolvedTest], list[tuple[str | None, str]]]:
    """Every spec's tests, and (spec, why) for each spec that cannot run.

    All specs are matched first, without reading a file; past ``cap`` distinct files the comment is
    refused at once. Only then are the (at most ``cap``) files' registrations read."""
    deadline = deadline or Deadline()
    matched: list[tuple[TestSpec, list[str]]] = []
    refusals: list[tuple[str | None, str]] = []
    files: set[str] = set()
    for spec in specs:
        deadline.check()
        try:
            matched.append((spec, _selected(spec, _matching_files(spec, tree))))
        except SpecRefused as err:
            refusals.append((spec.text, str(err)))
            continue
        files.update(matched[-1][1])
        if len(files) > cap:
            return [], [(None, f"the tests named match more than {cap} test files; at most {MAX_STARTS} tests "
                               "and matrix cells run per comment: narrow the wildcards or split the request")]
    resolved = []
    for spec, paths in matched:
        try:
            resolved.extend(_registered(spec, paths, tree))
        except SpecRefused as err:
            refusals.append((spec.text, str(err)))
    return resolved, refusals


def resolve_spec(spec: TestSpec, tree: TestTree) -> list[ResolvedTest]:
    return _registered(spec, _selected(spec, _matching_files(spec, tree)), tree)


def _selected(spec: TestSpec, matches: list[str]) -> list[str]:
    if len(matches) > 1 and spec.selector:
        raise SpecRefused(f"{spec.file_part} matched {len(matches)} files; a ::{spec.selector} "
                          "selector needs exactly one")
    return matches


def _registered(spec: TestSpec, matches: list[str], tree: TestTree) -> list[ResolvedTest]:
    resolved = []
    for path in matches:
        try:
            registration = chosen_registration(tree.test_dir / path, f"test/{path}")
        except RegistrationError as err:
            raise SpecRefused(str(err)) from None
        resolved.append(ResolvedTest(spec.text, path, spec.selector, registration))
    return resolved


def _matching_files(spec: TestSpec, tree: TestTree) -> list[str]:
    """Paths relative to test/, sorted, of the registered test files the spec names."""
    file_part = spec.file_part.removeprefix("test/")
    if "/" in file_part:
        if not file_part.startswith("registered/"):
            raise SpecRefused(f"only tests under test/registered/ can be rerun; got {spec.file_part}")
        pattern = file_part.split("/")
        matches = [f for f in tree.test_files if _path_matches(pattern, f.split("/"))]
        linked = [f for f in tree.symlinks if _path_matches(pattern, f.split("/"))]
    else:
        matches = [f for f in tree.test_files if fnmatch.fnmatchcase(f.rsplit("/", 1)[-1], file_part)]
        linked = [f for f in tree.symlinks if fnmatch.fnmatchcase(f.rsplit("/", 1)[-1], file_part)]
    if linked:
        raise SpecRefused(f"test/{clip(sorted(linked)[0])} is a symlink: refused ({ROOT_FIX})")
    unsafe = [m for m in matches if not SAFE_PATH.fullmatch(m)]
    if unsafe:
        raise SpecRefused(f"matched test/{clip(unsafe[0])}, whose name holds characters a test command cannot "
                          "carry (only letters, digits, _ - . /): rename the file")
    if not matches:
        raise SpecRefused(_not_found(file_part, tree))
    if len(matches) > 1 and not spec.has_wildcard:
        listed = (", ".join(f"test/{m}" for m in matches[:5])
                  + (f" and {len(matches) - 5} more" if len(matches) > 5 else ""))
        raise SpecRefused(f"Ambiguous filename {file_part} — matched {len(matches)} files: {listed}. "
                          f"Please provide the full path, e.g. /rerun-test test/{matches[0]}")
    return matches


def _path_matches(pattern: list[str], parts: list[str]) -> bool:
    """Segment-wise glob: ``*``/``?`` stay inside a segment, one ``**`` spans zero or more segments."""
    if "**" not in pattern:
        return len(pattern) == len(parts) and all(map(fnmatch.fnmatchcase, parts, pattern))
    at = pattern.index("**")
    head, tail = pattern[:at], pattern[at + 1:]
    if len(parts) < len(head) + len(tail):
        return False
    return (all(map(fnmatch.fnmatchcase, parts[:len(head)], head))
            and all(map(fnmatch.fnmatchcase, parts[len(parts) - len(tail):], tail)))


def _not_found(file_part: str, tree: TestTree) -> str:
    where = f"File not found: test/{file_part}" if "/" in file_part else \
        f"No test file found matching {file_part} under test/registered/"
    names = sorted({f.rsplit("/", 1)[-1] for f in tree.test_files[:MAX_SUGGESTION_NAMES] if SAFE_PATH.fullmatch(f)})
    close = difflib.get_close_matches(file_part.rsplit("/", 1)[-1], names, n=3, cutoff=0.6)
    return where + (f". Closest: {', '.join(close)}" if close else "")
