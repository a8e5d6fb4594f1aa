"""What a matrix means: crossing, exclude/include/overrides, merging, runner labels, ids, expectations."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from dspark_ci.ground.sglang.settings import BY_KEY, SETTINGS
from dspark_ci.matrices import load_cells
from dspark_ci.matrices.schema import CELL_KEYS, TOP_KEYS


def cells_of(tmp_path, text: str, name: str = "m.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return load_cells([str(path)])


def by_id(cells):
    return {cell.id: cell for cell in cells}


def test_axes_cross_in_written_order_and_exclude_drops_combinations(tmp_path):
    cells = cells_of(tmp_path, """\
        hardware: {cuda: h200}
        defaults: {model: org/m, tp: 8, enable_dp_attention: true}
        axes:
          dp: [2, 4]
          moe_a2a_backend: [none, deepep]
        exclude:
          - {dp: 2, moe_a2a_backend: deepep}
        """)
    assert [c.id for c in cells] == ["m-tp8-dp2-dpattn-a2a-none-cuda", "m-tp8-dp4-dpattn-a2a-none-cuda",
                                     "m-tp8-dp4-dpattn-a2a-deepep-cuda"]


def test_include_adds_cells_from_defaults_and_overrides_patch_every_match(tmp_path):
    cells = by_id(cells_of(tmp_path, """\
        sglang: ">=1.0.0"
        hardware: {cuda: h200}
        defaults: {model: org/m, tp: 8, speculative_algorithm: DSPARK}
        axes:
          enable_dp_lm_head: [true, false]
          enable_dp_attention: [true]
          dp: [8]
        include:
          - {dp: 4, enable_dp_attention: true}
        overrides:
          - match: {enable_dp_lm_head: false, enable_dp_attention: true}
            set:
              expect: {outcome: reject, message: "requires --enable-dp-lm-head"}
        """))
    rejected = [c for c in cells.values() if c.expect.outcome == "reject"]
    # matched after defaults apply: the include entry never set enable_dp_lm_head, so it is false
    assert sorted(c.id for c in rejected) == ["m-tp8-dp4-dpattn-a2a-none-dspark-cuda",
                                              "m-tp8-dp8-dpattn-a2a-none-dspark-cuda"]
    assert all(c.expect.sglang == ">=1.0.0" for c in cells.values())
    assert cells["m-tp8-dp8-dpattn-lmhead-a2a-none-dspark-cuda"].expect.outcome == "serve"
    # an overridden cell still points at the line that declared it, not at the override
    assert cells["m-tp8-dp4-dpattn-a2a-none-dspark-cuda"].line == 9


def test_env_merges_extra_args_append_and_suites_replace(tmp_path):
    [cell] = cells_of(tmp_path, """\
        hardware: {cuda: h200}
        defaults:
          model: org/m
          env: {A: "1", B: "2"}
          extra_args: [--mem-fraction-static, "0.8"]
          suites: {gpqa: {num_questions: 20}, accept: null}
        include:
          - env: {B: "3", C: "4"}
            extra_args: [--chunked-prefill-size, "4096"]
            suites: {speed: {num_requests: 4}}
        """)
    assert dict(cell.env) == {"A": "1", "B": "3", "C": "4"}
    assert cell.extra_args == ("--mem-fraction-static", "0.8", "--chunked-prefill-size", "4096")
    assert {k: dict(v) for k, v in cell.suites.items()} == {"speed": {"num_requests": 4}}


@pytest.mark.parametrize("cell_yaml, runner", [
    ("{tp: 8}", "8-gpu-h200"),
    ("{nnodes: 2, tp: 16}", "2x8-gpu-h200"),
    ("{device: npu, gpus_per_node: 16, tp: 16}", "16-npu-a3"),
    ("{hardware: h100, gpus_per_node: 4, tp: 4}", "4-gpu-h100"),
    ("{tp: 8, runner: my-big-box}", "my-big-box"),
], ids=["one-node", "two-nodes", "npu", "cell-hardware", "explicit"])
def test_runner_label_is_derived_unless_set(tmp_path, cell_yaml, runner):
    [cell] = cells_of(tmp_path, f"""\
        hardware: {{cuda: h200, npu: a3}}
        defaults: {{model: org/m}}
        include:
          - {cell_yaml}
        """)
    assert cell.runner == runner


def test_ids_are_readable_prefixed_suffixed_and_tagged_by_admission_env(tmp_path):
    cells = cells_of(tmp_path, """\
        id_prefix: release
        hardware: {cuda: h200}
        defaults: {model: deepseek-ai/DeepSeek-V4-Flash, tp: 8, speculative_algorithm: DSPARK}
        include:
          - {}
          - {id_suffix: long-ctx}
          - {env: {SGLANG_RAGGED_VERIFY_MODE: compact}}
          - {env: {SGLANG_RAGGED_VERIFY_MODE: static, DSPARK_SIM_SEED: "3"}, id_suffix: seeded}
          - {model_slug: dsv4-flash, nnodes: 2, tp: 16, cp: 2, cp_strategy: zigzag, pp: 1}
          - {id: hand-picked-name}
        """)
    assert [c.id for c in cells] == [
        "release-deepseek-v4-flash-tp8-a2a-none-dspark-cuda",
        "release-deepseek-v4-flash-tp8-a2a-none-dspark-cuda-long-ctx",
        "release-deepseek-v4-flash-tp8-a2a-none-dspark-rv-compact-cuda",
        "release-deepseek-v4-flash-tp8-a2a-none-dspark-cuda-seeded",  # the default mode adds no tag
        "release-dsv4-flash-2node-tp16-cp2-zigzag-a2a-none-dspark-cuda",
        "hand-picked-name",
    ]


def test_ids_are_stable_across_loads_and_key_order(tmp_path):
    first = cells_of(tmp_path, "hardware: {cuda: h200}\ndefaults: {model: org/m}\n"
                               "include: [{tp: 8, dp: 2, enable_dp_attention: true}]\n", "a.yaml")
    second = cells_of(tmp_path, "hardware: {cuda: h200}\ninclude: [{enable_dp_attention: true, dp: 2, tp: 8}]\n"
                                "defaults: {model: org/m}\n", "b.yaml")
    assert first[0].id == second[0].id == "m-tp8-dp2-dpattn-a2a-none-cuda"


def test_yaml_anchors_and_merge_keys_work(tmp_path):
    cells = cells_of(tmp_path, """\
        hardware: {cuda: h200, npu: a3}
        defaults: {model: org/m}
        include:
          - &npu {device: npu, gpus_per_node: 16, tp: 16}
          - {<<: *npu, enable_dp_attention: true, dp: 4}
        """)
    assert [c.id for c in cells] == ["m-tp16-a2a-none-npu", "m-tp16-dp4-dpattn-a2a-none-npu"]


def test_config_carries_contract_keys_with_defaults(tmp_path):
    [cell] = cells_of(tmp_path, "hardware: {cuda: h200}\ndefaults: {model: org/m}\ninclude: [{}]\n")
    assert dict(cell.config) == {
        "model": "org/m", "device": "cuda", "hardware": "h200", "nnodes": 1, "gpus_per_node": 8, "tp": 1,
        "dp": 1, "enable_dp_attention": False, "enable_dp_lm_head": False, "cp": 1, "pp": 1,
        "moe_a2a_backend": "none", "speculative_algorithm": None,
    }
    assert cell.expect.to_dict() == {"outcome": "serve", "message": None, "sglang": None}


def test_every_cell_key_is_documented_for_matrix_authors():
    readme = (Path(__file__).resolve().parent.parent / "matrices" / "README.md").read_text()
    undocumented = [key for key in (*CELL_KEYS, *TOP_KEYS) if key not in BY_KEY  # settings: their rows say
                    and f"`{key}`" not in readme and f"{key}:" not in readme]
    assert not undocumented
    assert all(s.help and s.example.startswith(f"{s.key}: ") for s in SETTINGS)


def test_env_can_be_an_axis(tmp_path):
    cells = cells_of(tmp_path, """\
        hardware: {cuda: h200}
        defaults: {model: org/m, tp: 8, env: {HF_TOKEN: "${HF_TOKEN}"}}
        axes:
          env: [{SGLANG_RAGGED_VERIFY_MODE: static}, {SGLANG_RAGGED_VERIFY_MODE: compact}]
        """)
    assert [c.id for c in cells] == ["m-tp8-a2a-none-cuda", "m-tp8-a2a-none-rv-compact-cuda"]
    assert dict(cells[1].env) == {"HF_TOKEN": "${HF_TOKEN}", "SGLANG_RAGGED_VERIFY_MODE": "compact"}
