"""One row per SGLang setting (ground/sglang/settings.py): the matrix schema, the launch plan and the report's
config line all follow the row, so a setting added there reaches every stage (proved with --kv-cache-dtype)."""

from __future__ import annotations

from pathlib import Path

import pytest
from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.records import CellResult
from dspark_ci.ground.sglang.flags import load_flags
from dspark_ci.ground.sglang.settings import SETTINGS, launch_args
from dspark_ci.launchers.launch_plan import plan_launch
from dspark_ci.launchers.plan_types import Placement
from dspark_ci.matrices import load_cells
from dspark_ci.reports.markdown import _config_line

EXAMPLE = Path(__file__).resolve().parent.parent / "matrices" / "examples" / "kv_cache_dtype.yaml"
PLACEMENT = Placement(bind_hosts=("127.0.0.1",), leader_addr="127.0.0.1", port=30000, dist_port=30001)


def test_a_setting_row_reaches_the_schema_the_plan_and_the_report():
    plain, fp8 = load_cells([str(EXAMPLE)])
    assert "kv_cache_dtype" not in plain.config and fp8.config["kv_cache_dtype"] == "fp8_e4m3"
    argv = plan_launch(fp8, PLACEMENT).ranks[0].argv
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    assert "--kv-cache-dtype" not in plan_launch(plain, PLACEMENT).ranks[0].argv
    line = _config_line(CellResult(id=fp8.id, config=fp8.config, expect=fp8.expect))
    assert "kv fp8_e4m3" in line and "kv" not in _config_line(CellResult(id="x", config=plain.config,
                                                                           expect=plain.expect))


def test_a_value_sglang_does_not_accept_is_refused_at_its_line(tmp_path):
    matrix = tmp_path / "m.yaml"
    matrix.write_text("hardware: {cuda: h200}\ndefaults: {model: org/m, tp: 8}\ninclude:\n  - {kv_cache_dtype: fp9}\n")
    with pytest.raises(BadInput, match=r"m.yaml:4: kv_cache_dtype must be one of auto, fp8_e5m2"):
        load_cells([str(matrix)])


def test_every_flag_a_row_emits_is_in_the_release_snapshot():
    flags = load_flags()
    config = {**{s.key: s.default for s in SETTINGS},
              "model": "m", "tp": 8, "dp": 2, "enable_dp_attention": True, "cp": 2, "pp": 2,
              "speculative_algorithm": "DSPARK"}
    config.update({s.key: (s.choices[-1] if s.choices else 3 if s.type is int else True if s.type is bool else "x")
                   for s in SETTINGS if config.get(s.key) is None and s.flag})
    emitted = [token for token in launch_args(config) if token.startswith("--")]
    assert "--kv-cache-dtype" in emitted and [t for t in emitted if flags.get(t) is None] == []


DRAFT_KV = """hardware: {cuda: h200}
defaults: {model: org/m, model_slug: m, tp: 8, speculative_algorithm: DSPARK, speculative_block_size: 7}
include:
  - {}
  - {speculative_draft_kv_cache_dtype: fp8_e4m3}
"""


def test_a_row_added_alone_names_its_cells_plans_its_flag_and_is_resolved(tmp_path):
    """--speculative-draft-kv-cache-dtype came in as one row: sibling cells differing only in it get ids of their
    own (no "cell id ... already used"), the plan passes the flag, SGLang's resolver is asked for the resolved
    value, and the parity reference (no speculation) drops it with the rest of the draft's settings."""
    from dspark_ci.ground.sglang.settings import RESOLVED_FIELDS

    matrix = tmp_path / "m.yaml"
    matrix.write_text(DRAFT_KV)
    plain, fp8 = load_cells([str(matrix)])
    assert plain.id == "m-tp8-a2a-none-dspark-b7-cuda" and fp8.id == "m-tp8-a2a-none-dspark-b7-dkv-fp8_e4m3-cuda"
    argv = plan_launch(fp8, PLACEMENT).ranks[0].argv
    assert argv[argv.index("--speculative-draft-kv-cache-dtype") + 1] == "fp8_e4m3"
    assert "--speculative-draft-kv-cache-dtype" not in plan_launch(plain, PLACEMENT).ranks[0].argv
    assert "speculative_draft_kv_cache_dtype" in RESOLVED_FIELDS
    assert fp8.config.without_speculation().get("speculative_draft_kv_cache_dtype") is None


def test_a_draft_kv_dtype_sglang_does_not_know_is_refused_at_its_line(tmp_path):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(DRAFT_KV.replace("fp8_e4m3", "int4"))
    with pytest.raises(BadInput, match=r"m.yaml:5: speculative_draft_kv_cache_dtype must be one of auto, fp8_e5m2"):
        load_cells([str(matrix)])
