"""The simulator's knobs: one list in sglang_sim/sim_config.py, every one documented, defaults agreeing."""

from __future__ import annotations

from pathlib import Path

import pytest
from dspark_ci.sglang_sim.sim_config import FAULT_PARSERS, KNOBS, Faults, SimConfig, SimConfigError, parse_faults

README = Path(__file__).resolve().parents[1] / "sglang_sim" / "README.md"


def test_defaults_of_the_record_are_the_documented_defaults():
    assert SimConfig.from_env({}) == SimConfig()


def test_every_knob_and_fault_is_in_the_readme():
    text = README.read_text()
    missing = [knob.env for knob in KNOBS.values() if f"`{knob.env}`" not in text]
    missing += [name for name in FAULT_PARSERS if f"`{name}" not in text]
    assert not missing


@pytest.mark.parametrize("text, faults", [
    pytest.param("", Faults(), id="none"),
    pytest.param("accept_collapse, slow_decode=2.5", Faults(accept_collapse=True, slow_decode=2.5), id="two"),
    pytest.param("boot_reject=a, b, c,hang_boot", Faults(boot_reject="a, b, c", hang_boot=True),
                 id="message-with-commas"),
    pytest.param("rank_exit=1:5", Faults(rank_exit=(1, 5.0)), id="rank-exit"),
])
def test_fault_lists(text, faults):
    assert parse_faults(text) == faults


@pytest.mark.parametrize("text", ["crash_first_prefill=now", "slow_decode=0", "slow_decode", "boot_reject"])
def test_fault_values_are_checked(text):
    with pytest.raises(SimConfigError):
        parse_faults(text)
