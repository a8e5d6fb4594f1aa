"""`dspark-ci run` with greedy parity on the simulated server: a tie flip is counted and stays green, a real mismatch
turns the cell red with both tokens and logprobs in report.md, and a tensor-parallel layout is compared with one
rank."""

from __future__ import annotations

import textwrap

from dspark_ci.ground.sglang.release import DEFAULT_VERSION

from tests.test_run_cli import ONE_NODE, REPO, SMOKE, Run

LAYOUT_MATRIX = textwrap.dedent("""\
    description: a tp-2 deployment's greedy tokens against the same model on one rank
    sglang: ">=SGLANG_VERSION"
    hardware: {cuda: h200}
    defaults:
      model: meta-llama/Llama-3.1-8B-Instruct
      model_slug: llama8b
      gpus_per_node: 2
      tp: 2
      env: {DSPARK_SIM_BOOT_SECONDS: "0", DSPARK_SIM_DECODE_STEP_MS: "1", DSPARK_SIM_PREFILL_MS_PER_TOKEN: "0"}
      suites:
        parity: {num_prompts: 3, max_tokens: 16, reference: one_rank}
    include:
      - {}
    """).replace("SGLANG_VERSION", DEFAULT_VERSION)
LAYOUT_CELL = "llama8b-tp2-a2a-none-cuda"


def test_a_tie_flip_is_counted_and_the_cell_stays_green(tmp_path):
    run = Run(tmp_path, SMOKE, "--cell", ONE_NODE, "--suites", "parity", faults="parity_tie_flip")
    done = run()
    assert done.returncode == 0, done.stderr
    metrics = run.cell(ONE_NODE)["metrics"]
    assert (metrics["parity_mismatches"], metrics["parity_tie_flips"]) == (0, 8)
    assert "| parity | Tie flips |  | 8 |" in (run.out / "report.md").read_text()


def test_a_mismatch_beyond_epsilon_is_red_and_the_report_shows_both_tokens_and_logprobs(tmp_path):
    run = Run(tmp_path, SMOKE, "--cell", ONE_NODE, "--suites", "parity", faults="parity_mismatch")
    done = run()
    assert done.returncode == 1, done.stderr
    cell = run.cell(ONE_NODE)
    assert cell["status"] == "failed" and cell["metrics"]["parity_mismatches"] == 8
    report = (run.out / "report.md").read_text()
    line = next(line for line in report.splitlines() if "beyond a tie" in line and "first: prompt 0" in line)
    assert "at token 3: tested '" in line and "vs reference '" in line
    assert line.count("logprob -") == 2 and "beyond epsilon" in line


def test_a_tensor_parallel_numerics_bug_is_caught_against_one_rank(tmp_path):
    matrix = tmp_path / "layout.yaml"
    matrix.write_text(LAYOUT_MATRIX)
    clean = Run(tmp_path / "clean", str(matrix))
    assert clean().returncode == 0, clean.done.stderr if clean.done else ""
    assert clean.cell(LAYOUT_CELL)["metrics"]["parity_mismatches"] == 0
    reference_argv = (clean.out / "logs" / LAYOUT_CELL / "reference" / "0.log").read_text().splitlines()[0]
    assert "--tp-size 1" in reference_argv
    broken = Run(tmp_path / "broken", str(matrix), faults="tp_numerics")
    done = broken()
    assert done.returncode == 1, done.stderr
    assert broken.cell(LAYOUT_CELL)["metrics"]["parity_mismatches"] == 3


def test_a_layout_reference_is_the_same_model_on_one_rank_without_speculation():
    from dspark_ci.matrices import load_cells

    from dspark_ci.cell_run import suite_names
    from dspark_ci.reference_boot import reference_of

    cells = {cell.id: cell for cell in load_cells([str(REPO / "matrices" / "cpu-engine.yaml")])}
    two_nodes = cells["smollm2-135m-2node-tp2-a2a-none-cpu"]
    reference = reference_of(two_nodes).config
    assert (reference.nnodes, reference.tp, reference.dp, reference.speculative) == (1, 1, 1, False)
    assert reference.model == two_nodes.config.model
    assert "parity" in suite_names(two_nodes, None)  # kept on a plain cell: it compares the layout
    ngram = cells["smollm2-135m-tp1-a2a-none-ngram-cpu"]
    assert reference_of(ngram).config == ngram.config.without_speculation()
    assert "parity" not in suite_names(cells["smollm2-135m-tp1-a2a-none-cpu"], ("parity",))
