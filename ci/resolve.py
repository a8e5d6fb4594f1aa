"""``/rerun-test`` specs -> test files under ``<repo-root>/test/registered/``, each with its runner.

A spec is a bare file name (searched everywhere under ``test/registered/``), a path starting
``registered/`` or ``test/registered/``, either one optionally with ``*``/``?`` wildcards, and an
optional ``::TestClass[.test_method]`` selector. A bare name without wildcards that matches
several files is refused: running one of them would be a guess.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from ci.commands import TestSpec
from ci.registry import Registration, RegistrationError, chosen_registration

TEST_FILE_PATTERN = "test_*.py"
MAX_FILES = 20  # per comment: a wildcard must not turn one comment into a whole-suite run


class SpecRefused(Exception):
    """One spec that cannot be run; ``str()`` is the reply text after ``⛔ <spec>: ``."""


@dataclass(frozen=True)
class ResolvedTest:
    spec: str  # as the user wrote it
    path: str  # relative to test/, e.g. "registered/spec/test_dflash.py"
    selector: str | None
    registration: Registration

    @property
    def command(self) -> str:
        """What runs inside test/: ``python3 <command>`` (SGLang's unittest-file convention)."""
        return f"{self.path} {self.selector}" if self.selector else self.path

    @property
    def runner(self) -> str:
        return self.registration.runner


def resolve_specs(specs: tuple[TestSpec, ...], repo_root: Path) -> tuple[list[ResolvedTest], list[tuple[str, str]]]:
    """Every spec's tests, and (spec, why) for each spec that cannot run."""
    resolved, refusals = [], []
    for spec in specs:
        try:
            resolved.extend(resolve_spec(spec, repo_root))
        except SpecRefused as err:
            refusals.append((spec.text, str(err)))
    files = sorted({test.path for test in resolved})
    if len(files) > MAX_FILES:
        refusals.append((" ".join(spec.text for spec in specs),
                         f"matched {len(files)} test files; at most {MAX_FILES} run per comment: "
                         "narrow the wildcards or split the request"))
    return resolved, refusals


def resolve_spec(spec: TestSpec, repo_root: Path) -> list[ResolvedTest]:
    test_dir = repo_root / "test"
    matches = _matching_files(spec, test_dir)
    if len(matches) > 1 and spec.selector:
        raise SpecRefused(f"{spec.file_part} matched {len(matches)} files; a ::{spec.selector} "
                          "selector needs exactly one")
    resolved = []
    for path in matches:
        shown = f"test/{path}"
        try:
            registration = chosen_registration(test_dir / path, shown)
        except RegistrationError as err:
            raise SpecRefused(str(err)) from None
        resolved.append(ResolvedTest(spec.text, path, spec.selector, registration))
    return resolved


def _matching_files(spec: TestSpec, test_dir: Path) -> list[str]:
    """Paths relative to test/, sorted, of the registered test files the spec names."""
    registered = test_dir / "registered"
    file_part = spec.file_part.removeprefix("test/")
    if "/" in file_part:
        if not file_part.startswith("registered/"):
            raise SpecRefused(f"only tests under test/registered/ can be rerun; got {spec.file_part}")
        candidates = test_dir.glob(file_part)
    else:
        candidates = registered.rglob(file_part)
    matches = sorted(_relative(path, test_dir) for path in candidates
                     if path.is_file() and fnmatch.fnmatchcase(path.name, TEST_FILE_PATTERN)
                     and _inside(path, registered))
    if not matches:
        raise SpecRefused(_not_found(spec, file_part))
    if len(matches) > 1 and not spec.has_wildcard:
        listed = ", ".join(f"test/{m}" for m in matches)
        raise SpecRefused(f"Ambiguous filename {file_part} — matched {len(matches)} files: {listed}. "
                          f"Please provide the full path, e.g. /rerun-test test/{matches[0]}")
    return matches


def _not_found(spec: TestSpec, file_part: str) -> str:
    if "/" in file_part:
        return f"File not found: test/{file_part}"
    return f"No test file found matching {file_part} under test/registered/"


def _relative(path: Path, test_dir: Path) -> str:
    return path.relative_to(test_dir).as_posix()


def _inside(path: Path, registered: Path) -> bool:
    # A symlink in the PR could point anywhere; only files really under test/registered/ count.
    try:
        path.resolve().relative_to(registered.resolve())
    except ValueError:
        return False
    return True
