"""``results.json`` (schema 1, CONTRACT.md): written atomically after every cell, read back strictly.

A run may be killed at any moment, so the file on disk is always either the previous complete
version or the new one (temp file in the same directory, fsync, rename). Reading never crashes
with a traceback: a missing, half-written or foreign file becomes one ``BadInput`` message.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import numbers
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.records import READERS, CellResult, RunResults, Status

STATUSES = tuple(status.value for status in Status)


def write_results(path: Path | str, results: RunResults) -> None:
    """Write ``results`` as JSON so that ``path`` is never seen half-written.

    NaN and infinities (a mean over nothing) become null: JSON has no spelling for them.
    """
    write_text_atomically(Path(path), results_text(results))


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def write_text_atomically(path: Path, text: str) -> None:
    """Temp file in the same directory, fsync, rename: readers see the old file or the new one."""
    write_files_atomically({path: text})


def write_files_atomically(files: Mapping[Path, str]) -> None:
    """A set of files written together: each to a temp name beside it (fsync) first, then all renamed, in the
    given order, with nothing else in between. A kill or an error before the renames leaves every old file as it
    was; readers only ever see whole files."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, text in files.items():
            staged.append((_staged(path, text), path))
        for tmp_name, path in staged:
            os.replace(tmp_name, path)
    except BaseException:
        for tmp_name, _ in staged:
            Path(tmp_name).unlink(missing_ok=True)
        raise


def _staged(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; reports are shared artifacts
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            tmp.write(text)
            tmp.flush()
            os.fsync(tmp.fileno())
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return tmp_name


def results_text(results: RunResults) -> str:
    """results.json's contents. NaN and infinities (a mean over nothing) become null: JSON has no spelling for them."""
    return json.dumps(_finite(results.to_dict()), indent=2, allow_nan=False) + "\n"


def load_results(path: Path | str) -> RunResults:
    """Read and check a results.json; anything unusable raises ``BadInput`` naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(str(path), "no such file", "give a run directory written by `dspark-ci run --out DIR`") from None
    except (OSError, UnicodeDecodeError) as err:
        raise BadInput(str(path), f"cannot read it ({err})", "check the file's permissions and contents") from None
    try:
        results = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadInput(f"{path}:{err.lineno}", f"not valid JSON ({err.msg})",
                       "the run that wrote it was probably killed mid-write; run the cells again") from None
    except RecursionError:  # Python's parser recurses per level: 100,000 `[` overflow it
        raise BadInput(str(path), "nested too deeply to be a results.json",
                       "this is not a results.json written by dspark-ci; run the cells again") from None
    except ValueError as err:  # e.g. an integer of more than 4300 digits
        raise BadInput(str(path), f"not a results.json dspark-ci can read ({err})",
                       "this is not a results.json written by dspark-ci; run the cells again") from None
    _check_results(path, results)
    try:
        return RunResults.from_dict(results)
    except RecursionError:
        raise BadInput(str(path), "nested too deeply to be a results.json",
                       "this is not a results.json written by dspark-ci; run the cells again") from None


def _check_results(path: Path, results) -> None:
    def bad(problem: str):
        raise BadInput(str(path), problem, "this is not a results.json written by dspark-ci; run the cells again")

    if not isinstance(results, dict):
        bad("the top level is not a JSON object")
    if results.get("schema") not in READERS:
        versions = ", ".join(str(version) for version in READERS)
        raise BadInput(str(path), f"schema {results.get('schema')!r} is not supported (this dspark-ci reads "
                       f"schema {versions})", "render it with the dspark-ci version that wrote it")
    cells = results.get("cells")
    if not isinstance(cells, list):
        bad('"cells" is missing or not a list')
    for index, cell in enumerate(cells):
        problem = _cell_problem(cell)
        if problem:
            bad(f"cells[{index}]: {problem}")


def _cell_problem(cell) -> str | None:
    if not isinstance(cell, dict):
        return "not a JSON object"
    if not isinstance(cell.get("id"), str):
        return '"id" is missing or not a string'
    if cell.get("status") not in STATUSES:
        return f'"status" is {cell.get("status")!r}, expected one of {", ".join(STATUSES)}'
    metrics = cell.get("metrics", {})
    if not isinstance(metrics, dict) or not all(_is_number(v) or v is None for v in metrics.values()):
        return '"metrics" must map metric names to numbers'
    gates = cell.get("gates", [])
    if not isinstance(gates, list) or not all(_is_gate(gate) for gate in gates):
        return '"gates" must be a list of {"metric", "op", "threshold", "value", "passed"}'
    if cell.get("quarantine") is not None and not _is_quarantine_entry(cell["quarantine"]):
        return '"quarantine" must be {"cell", "reason", "link", "expires": "YYYY-MM-DD", "where"}'
    return None


def _is_quarantine_entry(entry) -> bool:
    keys = ("cell", "reason", "link", "expires", "where")
    if not isinstance(entry, dict) or not all(isinstance(entry.get(key), str) for key in keys):
        return False
    try:
        dt.date.fromisoformat(entry["expires"])
    except ValueError:
        return False
    return True


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_gate(gate) -> bool:
    return (isinstance(gate, dict) and isinstance(gate.get("metric"), str) and gate.get("op") in (">=", "<=")
            and _is_number(gate.get("threshold")) and (gate.get("value") is None or _is_number(gate["value"]))
            and isinstance(gate.get("passed"), bool))


def error_headline(cell: CellResult) -> str:
    """One line for a cell's error: its first line, plus SGLang's own ``SomeError: ...`` line when it has one."""
    lines = [line.strip() for line in (cell.error or "").strip().splitlines()]
    if not lines:
        return ""
    said = cell.sglang_error
    return f"{lines[0]}: {said}" if said and said != lines[0] and said not in lines[0] else lines[0]


def rejection_message(cell: CellResult) -> str:
    """What SGLang said when it rejected a cell as expected ("" for other cells)."""
    if cell.status is not Status.REJECTED_AS_EXPECTED:
        return ""
    return cell.sglang_error or cell.error or ""


def quarantine_line(cell: CellResult) -> str:
    """What the quarantine file said of a cell, in one line with its ticket and expiry ("" for a cell no entry
    matched): held, it does not gate; expired, it gates again."""
    entry = cell.quarantine
    if cell.quarantine_expired:
        if entry is None:  # a results.json written before the entry travelled with the cell
            return "quarantine expired: this cell gates again"
        return (f"quarantine expired on {entry.expires} ({entry.where}): this cell gates again "
                f"({entry.reason}; {entry.link})")
    if not cell.quarantined:
        return ""
    if entry is None:
        return "quarantined, not gating"
    return f"quarantined until {entry.expires} ({entry.where}), not gating: {entry.reason}; {entry.link}"
