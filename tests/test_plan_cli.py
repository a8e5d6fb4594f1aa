"""`dspark-ci plan` formats and selection, as a CI workflow or a person uses them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark_ci.cli import main

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def in_repo_root(monkeypatch):
    """Shipped matrices are named as a user in the repository root names them."""
    monkeypatch.chdir(REPO)


HEAD = "hardware: {cuda: h200}\ndefaults: {model: org/model, speculative_algorithm: DSPARK}\n"


def many_cells(tmp_path, count: int) -> str:
    """A matrix of `count` valid cells (one per DSpark block size)."""
    matrix = tmp_path / f"many-{count}.yaml"
    matrix.write_text(HEAD + f"axes:\n  speculative_block_size: {list(range(1, count + 1))}\n")
    return str(matrix)


def plan(argv, capsys):
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_github_matrix_up_to_256_cells_is_one_include(tmp_path, capsys):
    code, out, err = plan([many_cells(tmp_path, 256), "--format", "github"], capsys)
    assert code == 0 and err == ""
    matrix = json.loads(out)
    assert list(matrix) == ["include"]
    assert len(matrix["include"]) == 256
    assert matrix["include"][0] == {"cell": "model-tp1-a2a-none-dspark-b1-cuda", "runner": "8-gpu-h200",
                                    "matrix": str(tmp_path / "many-256.yaml"), "expect": "serve", "nnodes": 1}
    assert len(out.strip().splitlines()) == 1  # one line, for $GITHUB_OUTPUT


def test_github_matrix_past_256_cells_splits_into_chunks_and_says_so(tmp_path, capsys):
    code, out, err = plan([many_cells(tmp_path, 600), "--format", "github"], capsys)
    assert code == 0
    matrix = json.loads(out)
    assert list(matrix) == ["chunks"]
    sizes = [len(chunk["include"]) for chunk in matrix["chunks"]]
    assert sizes == [256, 256, 88]
    ids = [entry["cell"] for chunk in matrix["chunks"] for entry in chunk["include"]]
    assert len(ids) == len(set(ids)) == 600
    assert ids[0].endswith("-b1-cuda") and ids[-1].endswith("-b600-cuda")  # cell order kept
    assert "600 cells exceed GitHub's 256 jobs per matrix: split into 3 chunks (256, 256, 88)" in err
    assert "chunks[0] .. chunks[2]" in err


def test_help_documents_the_split(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert '{"chunks": [{"include": [...]}, ...]}' in text
    assert "fromJSON(needs.plan.outputs.matrix).chunks[0]" in text


def test_select_keeps_matching_ids_in_every_format(capsys):
    code, out, _ = plan(["matrices/nightly.yaml", "--select", "*-npu", "--format", "github"], capsys)
    assert code == 0
    entries = json.loads(out)["include"]
    assert len(entries) == 4
    assert {e["runner"] for e in entries} == {"16-npu-a3"}
    code, out, _ = plan(["matrices/nightly.yaml", "--select", "*-npu", "--select", "*dflash*"], capsys)
    assert code == 0
    assert out.strip().endswith("6 cells")


def test_table_shows_layout_expectation_and_runner(capsys):
    code, out, _ = plan(["matrices/smoke.yaml"], capsys)
    assert code == 0
    header, rule, *rows, total = out.strip().splitlines()
    assert header.split() == ["id", "runner", "expect", "tp/dp/cp/pp", "a2a", "spec", "nodes"]
    assert set(rule.replace(" ", "")) == {"-"}
    assert rows[1].split() == ["dsv4-flash-2node-tp16-a2a-none-dspark-b7-cuda", "2x8-gpu-h200", "serve",
                               "16/1/1/1", "none", "DSPARK(7)", "2"]
    assert rows[2].split()[2:4] == ["reject", "8/attn4/1/1"]
    assert total == "3 cells"


def test_unknown_format_is_bad_input(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "matrices/smoke.yaml", "--format", "yaml"])
    assert exit_info.value.code == 2
    assert "--format" in capsys.readouterr().err
