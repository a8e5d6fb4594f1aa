"""bench/planted_bugs.py's own machinery: a bug is planted in a shadow copy only (never the venv), a patch that no
longer matches says so, and a red cell counts as caught only for one of the bug's right reasons."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import planted_bugs  # noqa: E402

BUG = replace(planted_bugs.BUGS[0], file="srt/worker.py", old="return drafts\n", new="return garbage\n")


def fake_site(tmp_path: Path, source: str) -> Path:
    package = tmp_path / "site" / "sglang"
    (package / "srt").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "srt" / "worker.py").write_text(source)
    return tmp_path / "site"


def test_the_bug_goes_into_the_shadow_and_the_venv_is_left_alone(tmp_path):
    site = fake_site(tmp_path, "def f():\n    return drafts\n")
    shadow = planted_bugs.plant(BUG, site, tmp_path / "work")
    assert isinstance(shadow, Path)
    assert "return garbage" in (shadow / "sglang" / "srt" / "worker.py").read_text()
    assert planted_bugs.MARKER in (shadow / "sglang" / "__init__.py").read_text()
    assert (site / "sglang" / "srt" / "worker.py").read_text() == "def f():\n    return drafts\n"


def test_a_patch_that_matches_twice_or_never_does_not_apply(tmp_path):
    for source in ("return drafts\nreturn drafts\n", "return proposals\n"):
        why = planted_bugs.plant(BUG, fake_site(tmp_path / str(len(source)), source), tmp_path / str(len(source)))
        assert isinstance(why, str) and "this SGLang differs" in why


def cell(status: str, error: str | None = None, gates=(), tests=()) -> dict:
    return {"id": "c", "status": status, "error": error, "gates": list(gates), "tests": list(tests)}


def test_caught_only_for_a_right_reason():
    floor = {"nodeid": "suites/test_sanity.py::test_drafts_are_accepted", "outcome": "failed", "message": "low"}
    assert planted_bugs.judge(BUG, {"cells": [cell("failed", tests=[floor])]})[0] == "caught"
    wrong = planted_bugs.judge(BUG, {"cells": [cell("error", error="boot timed out")]})
    assert wrong == ("caught (wrong reason)", "error: boot timed out")
    assert planted_bugs.judge(BUG, {"cells": [cell("passed")]})[0] == "missed"
    assert planted_bugs.judge(None, {"cells": [cell("passed")]})[0] == "green"
    assert planted_bugs.judge(None, {"cells": []})[0] == "red"


def test_every_bug_names_cells_of_the_engine_matrix_and_a_right_reason():
    from dspark_ci.matrices import load_cells
    cells = {c.id for c in load_cells([str(Path(planted_bugs.REPO) / "matrices" / "cpu-engine.yaml")])}
    for bug in planted_bugs.BUGS:
        assert set(bug.cells) <= cells and bug.right_reasons, bug.name


def test_a_bug_sglang_already_has_on_a_cpu_is_not_applicable_and_never_planted(tmp_path):
    # The pinned SGLang verifies greedily on a CPU whatever the temperature: planting "lossy sampling" there changes
    # nothing, so the bench says so rather than calling a run of the unchanged engine caught or missed.
    lossy = next(b for b in planted_bugs.BUGS if b.name == "spec-sampling-lossy")
    outcome = planted_bugs.one(lossy, lossy.cells, tmp_path / "no-site", "matrices/cpu-engine.yaml", None)
    assert outcome.verdict == "n/a" and "is_cpu" in outcome.why and outcome.seconds == 0
    assert not list(tmp_path.iterdir())  # no shadow copied, no run started
