"""Docs that list facts are generated from the code that holds them, and must be current: docs/CLI.md from the
verbs' parsers, matrices/README.md's key table from the settings rows and the matrix schema, docs/results.schema.json
(tests/test_results_schema.py). The few facts prose repeats are checked against the code here."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

from dspark_ci.ground.errors import ExitCode
from dspark_ci.ground.records import Status
from dspark_ci.ground.sglang.settings import SETTINGS
from dspark_ci.launchers.contract import Launcher
from dspark_ci.matrices import key_table

from dspark_ci import cli_reference
from dspark_ci.evidence import MAX_BOOTS

REPO = Path(__file__).resolve().parent.parent


def test_cli_reference_is_current():
    assert (REPO / "docs" / "CLI.md").read_text() == cli_reference.reference(), \
        "docs/CLI.md is stale: run `python -m dspark_ci.cli_reference --write`"


def test_cli_reference_does_not_depend_on_the_machine(tmp_path):
    """The terminal's width and the user's environment do not enter the reference (defaults read from the
    environment are documented by name, not by value)."""
    env = {**os.environ, "COLUMNS": "40", "KUBECONFIG": str(tmp_path / "k"), "DSPARK_SLURM_PARTITION": "p",
           "DSPARK_K8S_NAMESPACE": "ns", "DSPARK_DOCKER_HOSTS": str(tmp_path / "h"), "DSPARK_STATE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "dspark_ci.cli_reference"], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120, check=True)
    assert done.stdout == (REPO / "docs" / "CLI.md").read_text()


def test_every_verb_and_run_option_is_in_the_cli_reference():
    text = (REPO / "docs" / "CLI.md").read_text()
    assert all(f"## `dspark-ci {verb}`" in text for verb in cli_reference.VERBS)
    assert f"| `--max-boots N` | `{MAX_BOOTS}` |" in text


def test_matrix_key_table_is_current_and_has_every_setting():
    readme = (REPO / "matrices" / "README.md").read_text()
    assert readme == key_table.readme_text(readme), \
        "matrices/README.md's key table is stale: run `python -m dspark_ci.matrices.key_table --write`"
    assert all(f"| `{setting.key}` |" in readme for setting in SETTINGS)


def test_usage_states_the_max_boots_default_the_code_has():
    text = (REPO / "docs" / "USING.md").read_text()
    assert f"`--max-boots N`, default {MAX_BOOTS}" in text


def readme_table(heading: str) -> list[str]:
    """The first column of the table under the README's `## heading`, backticks stripped."""
    section = (REPO / "README.md").read_text().split(f"\n## {heading}\n")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    return [row.split("|")[1].strip().strip("`") for row in rows[1:]]


def test_readme_verb_table_has_every_verb_in_order():
    assert readme_table("Verbs") == list(cli_reference.VERBS)


def test_readme_exit_code_table_has_every_exit_code():
    assert readme_table("Exit codes") == [str(int(code)) for code in ExitCode] + ["130"]


def test_architecture_lists_every_status_and_the_launcher_methods_as_declared():
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    listed = re.search(r"`Status` is closed\s*\(([^)]*)\)", text)
    assert listed and re.findall(r"`(\w+)`", listed.group(1)) == [status.value for status in Status]
    for name in ("placement", "preflight", "launch"):
        parameters = list(inspect.signature(getattr(Launcher, name)).parameters.values())[1:]
        shown = ", ".join(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default}"
                          for p in parameters)
        assert f"`{name}({shown})" in text, f"docs/ARCHITECTURE.md should give `{name}({shown})`"


def test_contract_lists_every_exit_code():
    text = (REPO / "docs" / "CONTRACT.md").read_text()
    listed = [int(code) for code in re.findall(r"^- (\d+): ", text.split("Exit codes, for every verb:")[1], re.M)]
    assert set(ExitCode) <= set(listed), f"docs/CONTRACT.md's exit codes miss {set(ExitCode) - set(listed)}"
