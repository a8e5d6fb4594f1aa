"""The SGLang release under test is written once, in ground/sglang/release.py: a version bump touches
ground/sglang/ (and the matrices' expectations and the .ci pins, which are data about that release), and every
other file reads ``DEFAULT_VERSION``. Generated docs carry the version because their generator reads it."""

from __future__ import annotations

import fnmatch
import subprocess
from pathlib import Path

from dspark_ci.ground.sglang.release import DEFAULT_VERSION
from dspark_ci.matrices import key_table

REPO = Path(__file__).resolve().parent.parent
ALLOWED = (
    "ground/sglang/*",  # the release's own facts: release.py, the flag snapshot
    "matrices/*.yaml", "matrices/examples/*.yaml",  # expectations: written for a release, they say which
    ".ci/*",  # pins of the venvs CI builds
    "sglang_sim/metric_families-*.json",  # a snapshot taken from that release (found through release.py)
    "tests/golden/*",  # generated output (DSPARK_UPDATE_GOLDEN=1 writes it again); tests read DEFAULT_VERSION
    "BENCHMARKS.md", "baselines/*.yaml",  # a measurement names the release it measured
    "docs/CLI.md",  # generated from the parsers, whose help reads release.py
)
PENDING: tuple[str, ...] = ()  # files still carrying the literal, each to be made to read release.py


def tracked_files() -> list[str]:
    done = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=REPO, check=True)
    return done.stdout.splitlines()


def offenders() -> list[str]:
    found = []
    generated = key_table.table()
    for name in tracked_files():
        if any(fnmatch.fnmatch(name, pattern) for pattern in ALLOWED + PENDING):
            continue
        path = REPO / name
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if DEFAULT_VERSION in line and not (name == "matrices/README.md" and line in generated):
                found.append(f"{name}:{number}: {line.strip()[:100]}")
    return found


def test_the_release_number_is_written_only_where_it_belongs():
    assert offenders() == [], ("these lines should read ground/sglang/release.py (DEFAULT_VERSION) instead:\n"
                               + "\n".join(offenders()))


def test_the_check_would_catch_a_new_literal(tmp_path, monkeypatch):
    """The grep is not vacuous: a tracked file outside the allowed places that names the release is listed."""
    monkeypatch.setattr(__import__(__name__), "tracked_files", lambda: ["README.md"])
    readme = (REPO / "README.md").read_text()
    assert DEFAULT_VERSION not in readme
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: f"pip install sglang=={DEFAULT_VERSION}\n")
    assert offenders() == [f"README.md:1: pip install sglang=={DEFAULT_VERSION}"]
