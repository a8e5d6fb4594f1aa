"""One namespace: the wheel carries every folder of the clone under ``dspark_ci`` (pyproject), and the shipped
matrices are reachable by name from wherever dspark-ci is installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomllib
from dspark_ci.matrices.shipped import matrix_path, shipped

import dspark_ci

REPO = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_clone_folder_installs_inside_the_namespace():
    mapped = {name: folder for name, folder in SETUPTOOLS["package-dir"].items() if name != "dspark_ci"}
    assert {f"dspark_ci.{folder}" for folder in dspark_ci.CLONE_FOLDERS} <= set(mapped)
    assert all(name == f"dspark_ci.{folder}" for name, folder in mapped.items())


def test_every_folder_with_files_is_a_listed_package():
    """A folder left out of pyproject's list would be missing from the wheel (data folders included)."""
    listed = set(SETUPTOOLS["packages"])
    wanted = set()
    for name, folder in SETUPTOOLS["package-dir"].items():
        for path in [REPO / folder, *(REPO / folder).rglob("*")]:
            if path.is_dir() and path.name != "__pycache__" and "model_configs" not in path.parent.parts \
                    and path.parent.name != "model_configs":
                wanted.add(".".join([name, *path.relative_to(REPO / folder).parts]))
    assert wanted - listed == set()


def test_a_shipped_matrix_runs_by_name_and_a_file_stays_a_file(tmp_path, monkeypatch):
    assert Path(matrix_path("smoke")) == REPO / "matrices" / "smoke.yaml"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smoke").write_text("mine")
    assert matrix_path("smoke") == "smoke"
    assert matrix_path("no-such-matrix") == "no-such-matrix"


def test_the_matrices_verb_lists_the_shipped_matrices():
    listed = subprocess.run([sys.executable, "-m", "dspark_ci", "matrices"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout
    assert {line.split("\t")[0] for line in listed.splitlines()} == set(shipped()) >= {"smoke", "nightly"}
