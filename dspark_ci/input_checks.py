"""What a run needs beyond the matrix, checked before the first launch: every file a suite will read, every optional
package a selected scorer needs, every simulator knob. Each problem is BadInput (exit 2) naming the cell's
``file:line`` and the fix, found in seconds instead of after a server has booted.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlparse

from dspark_ci.cell_run import suite_names
from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.suites import SUITE_DEFAULTS
from dspark_ci.matrices.cell import REJECT, Cell
from dspark_ci.sglang_sim.cpu_engine import missing_checkpoint as engine_missing_checkpoint
from dspark_ci.sglang_sim.cpu_engine import refusal as engine_refusal
from dspark_ci.sglang_sim.sim_config import SimConfig, SimConfigError
from dspark_ci.suites import sgl_eval_scorer
from dspark_ci.suites.config import SuiteInputError
from dspark_ci.suites.datasets import resolve_local

# GPQA Diamond is 1.3 MB, the extended set 5 MB: past this a "dataset" is another file.
MAX_DATASET_BYTES = 64 * 2**20


def check_before_launch(cells: list[Cell], selected: tuple[str, ...] | None, server: str,
                        caller_env: Mapping[str, str], suite_defaults: Callable[[dict], dict]) -> None:
    """Raise BadInput for the first cell whose suites, scorer or simulator settings cannot work."""
    warned: set[tuple[str, str, str]] = set()
    for cell in cells:
        where = f"{cell.matrix}:{cell.line}" if cell.line else cell.matrix
        _check_names_and_env(cell, where)
        if server == "sim":
            _check_simulator(cell, caller_env, where)
            _warn_overridden(cell, caller_env, where, warned)
        if server == "sglang-engine":
            _check_engine(cell, where, caller_env)
        if cell.expect.outcome == REJECT:
            continue
        names = suite_names(cell, selected)
        options = suite_defaults({name: {**SUITE_DEFAULTS[name], **cell.suites.get(name, {})} for name in names})
        if "gpqa" in options:
            _check_gpqa(options["gpqa"], where, cell.id)


def _check_engine(cell: Cell, where: str, caller_env: Mapping[str, str]) -> None:
    """SGLang's real engine on this CPU serves only what the pinned SGLang release has a CPU branch for, and a
    real model only once it is installed and converted (nothing is downloaded at run time)."""
    algorithm = dict(cell.config).get("speculative_algorithm")
    argv = ("--model-path", cell.config.model, *(("--speculative-algorithm", str(algorithm)) if algorithm else ()))
    reason = engine_refusal(argv)
    if reason:
        raise BadInput(where, f"cell {cell.id}: {reason}",
                       "leave the cell out (--cell), or run it on a GPU (--server sglang) or the simulator")
    missing = engine_missing_checkpoint(argv, caller_env)
    if missing:
        raise BadInput(where, f"cell {cell.id}: {missing}", "make it once, then run again")


def _check_gpqa(options: Mapping, where: str, cell_id: str) -> None:
    dataset = options.get("dataset")
    if dataset and urlparse(str(dataset)).scheme not in ("http", "https"):
        _check_dataset(str(dataset), where, cell_id)
    if options.get("scorer") == "sgl-eval":
        try:
            sgl_eval_scorer.modules()
        except SuiteInputError as err:
            raise BadInput(where, f"cell {cell_id}: {err}", "or choose another gpqa.scorer") from None


def _check_dataset(dataset: str, where: str, cell_id: str) -> None:
    try:
        path = resolve_local(dataset)
    except SuiteInputError:
        raise BadInput(where, f"cell {cell_id}: gpqa.dataset {dataset} is not a file",
                       "give the path of a GPQA CSV, relative to the working directory or the repository, or an "
                       "http(s) URL") from None
    info = path.stat()
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_DATASET_BYTES:
        raise BadInput(where, f"cell {cell_id}: gpqa.dataset {path} is {info.st_size / 2**20:.0f} MiB, more than "
                       f"a GPQA CSV ({MAX_DATASET_BYTES // 2**20} MiB at most)", "check the path")
    if not os.access(path, os.R_OK):
        raise BadInput(where, f"cell {cell_id}: gpqa.dataset {path} cannot be read", "check its permissions")


def _check_simulator(cell: Cell, caller_env: Mapping[str, str], where: str) -> None:
    """The simulator's knobs as every rank of this cell will see them (the caller's, then the cell's env)."""
    env = {**caller_env, **cell.env}
    try:
        config = SimConfig.from_env(env)
    except SimConfigError as err:
        origin = "the cell's env" if any(k in cell.env for k in _sim_names(str(err))) else "the environment"
        raise BadInput(where, f"cell {cell.id}: {err} (from {origin})",
                       "see `dspark-ci sim --help` for the simulator's knobs and faults") from None
    if config.gpqa_path is not None and not Path(config.gpqa_path).is_file():
        raise BadInput(where, f"cell {cell.id}: DSPARK_SIM_GPQA_PATH={config.gpqa_path} is not a file",
                       "point it at a GPQA CSV, e.g. suites/data/gpqa_synthetic.csv")


# A cell id names its log directory and files: past this, "File name too long" after launch (255 bytes per name).
MAX_CELL_ID_BYTES = 200


def _check_names_and_env(cell: Cell, where: str) -> None:
    if len(cell.id.encode()) > MAX_CELL_ID_BYTES:
        raise BadInput(where, f"cell id {cell.id[:60]}... is {len(cell.id.encode())} bytes; it names files, which "
                       f"hold at most {MAX_CELL_ID_BYTES}", "shorten the model_slug or the values the id is made of")
    for key, value in cell.env.items():
        if "\0" in str(key) or "\0" in str(value):
            raise BadInput(where, f"cell {cell.id}: env {str(key)[:40]!r} holds a NUL byte, which no process "
                           "environment can carry", "remove it")


def _warn_overridden(cell: Cell, caller_env: Mapping[str, str], where: str, warned: set) -> None:
    """A DSPARK_SIM_* the caller set and the cell's env overrides: said once per value pair, not dropped silently."""
    for key, value in cell.env.items():
        mine = caller_env.get(key)
        if (key.startswith("DSPARK_SIM_") and mine is not None and mine != str(value)
                and (key, mine, value) not in warned):
            warned.add((key, mine, value))
            print(f"dspark-ci run: warning: {where}: the matrix sets {key}={value} for cell {cell.id} (and others "
                  f"it covers), overriding {key}={mine} from your environment", file=sys.stderr)


def _sim_names(message: str) -> list[str]:
    return [word.rstrip(":=") for word in message.split() if word.startswith("DSPARK_SIM_")]
