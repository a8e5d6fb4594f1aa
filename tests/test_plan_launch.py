"""Launch plans: every command line is one the pinned SGLang release accepts, and says what the cell means."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from dspark_ci.ground.sglang.flags import load_flags
from dspark_ci.ground.sglang.release import DEFAULT_VERSION
from dspark_ci.ground.sglang.settings import SETTINGS
from dspark_ci.launchers.k8s.spec import pod_command
from dspark_ci.launchers.launch_plan import plan_launch
from dspark_ci.launchers.plan_types import SGLANG_ENTRYPOINT, Placement
from dspark_ci.launchers.slurm.script import task_words
from dspark_ci.matrices import load_cells

from dspark_ci.cli import main

REPO = Path(__file__).resolve().parent.parent
SHIPPED = sorted(str(p.relative_to(REPO)) for p in (REPO / "matrices").glob("*.yaml"))
PINNED_FLAGS = load_flags(DEFAULT_VERSION)


def shipped_cells():
    return [cell for path in SHIPPED for cell in load_cells([str(REPO / path)])]


@pytest.mark.parametrize("cell", shipped_cells(), ids=lambda c: c.id)
def test_every_argv_uses_only_the_pinned_releases_flags(cell):
    plan = plan_launch(cell, Placement.template(cell.nnodes))
    parser = PINNED_FLAGS.argument_parser()
    for rank in plan.ranks:
        assert rank.argv[:3] == SGLANG_ENTRYPOINT
        flags = [t for t in rank.argv[3:] if t.startswith("--")]
        unknown = [f for f in flags if PINNED_FLAGS.get(f) is None]
        assert not unknown, f"{cell.id}: not in SGLang {DEFAULT_VERSION}: {unknown}"
        parser.parse_args(list(rank.argv[3:]))  # values and choices too (exits on error)


def test_every_setting_reaches_sglang_or_is_placement():
    """A setting without a flag rule would be silently dropped from the command line: only placement and naming
    settings, and the two another row's rule renders (dp's, cp's), have none."""
    flagless = {s.key for s in SETTINGS if s.flag is None}
    assert flagless == {"model_slug", "hardware", "nnodes", "gpus_per_node", "enable_dp_attention", "cp_strategy"}


EVERYTHING = """\
hardware: {cuda: h200}
defaults:
  model: org/target
  draft_model: org/draft
  device: cuda
  tp: 8
  pp: 1
  enable_dp_attention: true
  dp: 2
  enable_dp_lm_head: true
  cp: 4
  cp_strategy: interleave
  moe_a2a_backend: megamoe
  speculative_algorithm: DSPARK
  speculative_block_size: 5
  reasoning_parser: deepseek-v4
  trust_remote_code: true
  enable_metrics: true
  env: {SGLANG_RAGGED_VERIFY_MODE: static, HF_TOKEN: "${HF_TOKEN}"}
  extra_args: [--mem-fraction-static, "0.8"]
include: [{}]
"""


def test_sglang_reads_the_cell_config_from_the_argv(tmp_path):
    """Parse the planned argv with the pinned SGLang release's flag set and read back what the server gets."""
    matrix = tmp_path / "all.yaml"
    matrix.write_text(EVERYTHING)
    [cell] = load_cells([str(matrix)])
    [rank] = plan_launch(cell, Placement.loopback(1, port=31000, dist_port=21000)).ranks
    args = PINNED_FLAGS.argument_parser().parse_args(list(rank.argv[3:]))
    seen = {k: v for k, v in vars(args).items() if v is not None}
    assert seen == {
        "model_path": "org/target", "speculative_draft_model_path": "org/draft", "device": "cuda",
        "tp_size": "8", "attn_dp_size": "2", "enable_dp_lm_head": True,
        "enable_prefill_cp": True, "cp_strategy": "interleave", "attn_cp_size": "4",
        "moe_a2a_backend": "megamoe", "speculative_algorithm": "DSPARK",
        "speculative_dspark_block_size": "5", "reasoning_parser": "deepseek-v4",
        "trust_remote_code": True, "enable_metrics": True, "mem_fraction_static": "0.8",
        "host": "127.0.0.1", "port": "31000",
    }
    # Attention DP is spelled the pinned release's way: no deprecated --dp-size/--enable-dp-attention pair.
    assert "--dp-size" not in rank.argv and "--enable-dp-attention" not in rank.argv
    assert rank.env == {"SGLANG_RAGGED_VERIFY_MODE": "static", "HF_TOKEN": "${HF_TOKEN}",
                        "SGLANG_ENABLE_CP_V2": "1"}


def test_plain_dp_is_replicas_and_dflash_uses_its_block_flag(tmp_path):
    matrix = tmp_path / "m.yaml"
    matrix.write_text("hardware: {cuda: h100}\ndefaults: {model: org/m, gpus_per_node: 8}\ninclude:\n"
                      "  - {tp: 2, dp: 4, speculative_algorithm: DFLASH, draft_model: org/d,"
                      " speculative_block_size: 16}\n")
    [cell] = load_cells([str(matrix)])
    argv = plan_launch(cell, Placement.template(1)).ranks[0].argv
    text = " ".join(argv)
    assert "--tp-size 2 --dp-size 4" in text
    assert "--speculative-dflash-block-size 16" in text
    assert "--attn-dp-size" not in text and "--speculative-dspark-block-size" not in text


def test_two_nodes_run_the_same_command_with_their_rank_and_the_leader_address(tmp_path):
    [cell] = [c for c in load_cells([str(REPO / "matrices/smoke.yaml")]) if c.nnodes == 2]
    plan = plan_launch(cell, Placement.loopback(2, port=30500, dist_port=20500))
    rank0, rank1 = plan.ranks
    assert [r.node_rank for r in plan.ranks] == [0, 1]
    for rank, host in ((rank0, "127.0.0.1"), (rank1, "127.0.0.2")):
        argv = list(rank.argv)
        assert argv[argv.index("--host") + 1] == host
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--node-rank") + 1] == str(rank.node_rank)
        assert argv[argv.index("--dist-init-addr") + 1] == "127.0.0.1:20500"
    def strip(argv):
        return [t for i, t in enumerate(argv) if t not in ("--host", "--node-rank")
                and argv[i - 1] not in ("--host", "--node-rank")]
    assert strip(rank0.argv) == strip(rank1.argv)
    assert rank0.env == rank1.env
    assert plan.health_url == "http://127.0.0.1:30500/health"
    assert plan.base_url == "http://127.0.0.1:30500"


def test_cluster_launchers_put_their_own_placement_values_into_the_planned_command():
    """Kubernetes and Slurm render the plan's placement with their own values (LWS's environment, the task's shell
    variables), whatever the matrix's extra_args hold, and keep every other word as planned."""
    [cell] = [c for c in load_cells([str(REPO / "matrices/smoke.yaml")]) if c.nnodes == 2]
    plan = plan_launch(cell, Placement.loopback(2, port=30500, dist_port=20500))
    pod = pod_command(plan)
    value = {flag: pod[pod.index(flag) + 1] for flag in ("--host", "--node-rank", "--nnodes", "--dist-init-addr")}
    assert value == {"--host": "$(DSPARK_POD_IP)", "--node-rank": "$(LWS_WORKER_INDEX)",
                     "--nnodes": "$(LWS_GROUP_SIZE)", "--dist-init-addr": "$(LWS_LEADER_ADDRESS):20500"}
    for rank in plan.ranks:
        words, port, dist_port = task_words(rank)
        assert (port, dist_port) == (30500, 20500)
        shell = f'addr=10.1.1.9 rank=7 DSPARK_LEADER_ADDR=10.1.1.1; printf "%s\\n" {" ".join(words)}'
        expanded = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True).stdout
        expected = list(rank.argv)
        for flag, task_value in (("--host", "10.1.1.9"), ("--node-rank", "7"), ("--dist-init-addr", "10.1.1.1:20500")):
            expected[expected.index(flag) + 1] = task_value
        assert expanded.splitlines() == expected
    assert plan.device == cell.config["device"] and plan.port == 30500


def test_printed_plan_points_at_the_leader_reference_not_at_0_0_0_0():
    [cell] = [c for c in load_cells([str(REPO / "matrices/smoke.yaml")]) if c.nnodes == 2]
    plan = plan_launch(cell, Placement.template(2))
    assert plan.base_url == "http://${NODE0_ADDR}:30000"
    assert "${NODE0_ADDR}:20000" in plan.ranks[1].argv


CONTRACT_CELL_KEYS = {"id", "matrix", "config", "runner", "expect", "ranks"}
CONTRACT_CONFIG_KEYS = {"model", "device", "tp", "dp", "cp", "pp", "moe_a2a_backend", "enable_dp_attention",
                        "nnodes", "gpus_per_node", "speculative_algorithm"}


def planned_rank_groups(cell: dict) -> list[tuple[list, int]]:
    """Each deployment's ranks with its node count: the cell's own, or (PD: ``ranks`` is []) each instance's."""
    if "pd" not in cell:
        return [(cell["ranks"], cell["config"]["nnodes"])]
    assert cell["ranks"] == [], cell["id"]
    return [(i["ranks"], cell["roles"][i["role"]]["config"]["nnodes"]) for i in cell["pd"]["instances"]]


def all_ranks(cell: dict) -> list[dict]:
    return [rank for ranks, _ in planned_rank_groups(cell) for rank in ranks]


@pytest.mark.parametrize("matrix", SHIPPED)
def test_json_cells_have_the_contract_keys(matrix, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert main(["plan", matrix, "--format", "json"]) == 0
    cells = json.loads(capsys.readouterr().out)["cells"]
    assert cells
    for cell in cells:
        assert CONTRACT_CELL_KEYS <= cell.keys(), cell["id"]
        assert CONTRACT_CONFIG_KEYS <= cell["config"].keys(), cell["id"]
        assert cell["matrix"] == matrix
        assert cell["expect"]["outcome"] in ("serve", "reject")
        assert cell["expect"]["sglang"] == f">={DEFAULT_VERSION}"
        assert (cell["expect"]["message"] is None) == (cell["expect"]["outcome"] == "serve")
        for ranks, nnodes in planned_rank_groups(cell):
            assert [r["node_rank"] for r in ranks] == list(range(nnodes)), cell["id"]
        for rank in all_ranks(cell):
            assert set(rank) == {"node_rank", "argv", "env"}
            # Secrets only as references: HF_TOKEN, when present, is never a value.
            assert rank["env"].get("HF_TOKEN", "${HF_TOKEN}") == "${HF_TOKEN}"
