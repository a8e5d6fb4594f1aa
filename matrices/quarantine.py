"""The quarantine file: cells that keep running and being reported, but whose failure does not gate, until a date.

    quarantine:
      - cell: "dsv4-flash-*-dpattn-*"          # a glob over cell ids
        reason: DP-attention accept collapse under investigation
        link: https://github.com/sgl-project/sglang/issues/12345
        expires: 2026-12-31                   # from the day after, the cell gates again (and the report says so)

Every field is required: a quarantine nobody can trace or that never ends is how a broken cell stays hidden
(DataDog java-profiler #777, ktor #5838: entries carry a ticket and an expiry; a retry buys a label, never a pass).
A bad entry is exit 2 naming ``file:line`` before anything is launched.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from pathlib import Path

from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.records import QUARANTINE_EXPIRED, QUARANTINED, CellResult, QuarantineEntry
from dspark_ci.ground.yaml_lines import YamlList, YamlMap, config_file_words, load_yaml

QUARANTINE_FILE = config_file_words("quarantine file", "pass an existing file with --quarantine, or none")
FIELDS = ("cell", "reason", "link", "expires")
# Where the nightly's quarantine lives relative to the first matrix, as the matrices name their baselines
# (`baseline: ../baselines/...`): not in matrices/ itself, where `matrices/*.yaml` would take it for a matrix.
DEFAULT_PATH = Path("..") / "baselines" / "quarantine.yaml"


@dataclass(frozen=True)
class Quarantine:
    entries: tuple[QuarantineEntry, ...] = ()
    path: str | None = None

    def entry_for(self, cell_id: str) -> QuarantineEntry | None:
        return next((entry for entry in self.entries if entry.matches(cell_id)), None)


def default_path(matrices: list[str] | tuple[str, ...]) -> Path | None:
    """``../baselines/quarantine.yaml`` from the first matrix, when there is one."""
    candidate = Path(matrices[0]).parent / DEFAULT_PATH if matrices else None
    return candidate if candidate is not None and candidate.is_file() else None


def load_quarantine(path: Path | str) -> Quarantine:
    document = load_yaml(path, QUARANTINE_FILE)
    if document is None:
        return Quarantine((), str(path))
    if not isinstance(document, YamlMap) or set(document) - {"quarantine"}:
        raise BadInput(f"{path}:{getattr(document, 'line', 1)}", "expected one key, quarantine: a list of entries",
                       "see baselines/quarantine.yaml for the shape")
    items = document.get("quarantine") or YamlList()
    if not isinstance(items, YamlList):
        raise BadInput(f"{path}:{document.line_of('quarantine')}", "quarantine: is not a list",
                       "give a list of entries")
    return Quarantine(tuple(_entry(path, item, items.line_of(i)) for i, item in enumerate(items)), str(path))


def _entry(path: Path | str, item, line: int) -> QuarantineEntry:
    where = f"{path}:{line}"
    if not isinstance(item, YamlMap):
        raise BadInput(where, "an entry is not a mapping", f"give {', '.join(FIELDS)}")
    unknown = sorted(set(item) - set(FIELDS))
    missing = [name for name in FIELDS if item.get(name) in (None, "")]
    if unknown:
        raise BadInput(f"{path}:{item.line_of(unknown[0])}", f"unknown key {unknown[0]!r}",
                       f"the keys are {', '.join(FIELDS)}")
    if missing:
        raise BadInput(where, f"the entry has no {missing[0]}",
                       "every entry needs a cell glob, a reason, a link (issue) and an expiry date (YYYY-MM-DD)")
    expires = item["expires"]
    if isinstance(expires, str):
        try:
            expires = dt.date.fromisoformat(expires)
        except ValueError:
            expires = None
    if not isinstance(expires, dt.date) or isinstance(expires, dt.datetime):
        raise BadInput(f"{path}:{item.line_of('expires')}", f"expires: {item['expires']!r} is not a date",
                       "write it as YYYY-MM-DD")
    link = str(item["link"])
    if not link.startswith(("https://", "http://")):
        raise BadInput(f"{path}:{item.line_of('link')}", f"link: {link!r} is not a URL",
                       "link the issue that tracks it")
    return QuarantineEntry(str(item["cell"]), str(item["reason"]), link, expires, where)


def apply(quarantine: Quarantine, result: CellResult, today: dt.date) -> CellResult:
    """``result`` as the quarantine has it, carrying the entry that matched it (its ticket and expiry reach every
    report): labelled ``quarantined`` and not gating while the entry holds (it still ran, and its outcome is reported
    as it is); once the entry has expired, labelled ``quarantine_expired``: it gates again."""
    entry = quarantine.entry_for(result.id)
    if entry is None:
        return result
    if not entry.active(today):
        return replace(result, labels=(*result.labels, QUARANTINE_EXPIRED), quarantine=entry)
    return replace(result, labels=(*result.labels, QUARANTINED), quarantine=entry)  # CellResult.run_exit_code: 0
