"""The reply comment ChatOps posts, and the in-place status updates the rerun workflow makes.

One line per runner group, each carrying a hidden marker so the workflow can find its own line
and move the icon ⏳ (dispatched) → 🔄 (a runner picked it up) → ✅/❌ (finished) in the same
comment, as SGLang's bot does:

    🚀 `4-gpu-h100` (1 test): ⏳ queued <!--rrt:0-->
    ```
    cd test/ && python3 registered/spec/test_dflash.py
    ```
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from dspark_ci.ci.chatops.resolve_test_paths import ResolvedTest
from dspark_ci.ci.chatops.text import shown

STATUS_ICONS = {"queued": "⏳", "running": "🔄", "success": "✅", "failure": "❌", "not_dispatched": "⚠️"}
TERMINAL = frozenset({"success", "failure", "not_dispatched"})
REFUSED = "⛔"
MAX_REFUSAL_CHARS = 12_000  # a reply's refusals stop here (GitHub takes 65,536; nobody reads that many)


@dataclass(frozen=True)
class RunnerGroup:
    index: int  # position in the reply; names the marker
    runner: str
    backend: str
    tests: tuple[ResolvedTest, ...]

    @property
    def marker(self) -> str:
        return f"<!--rrt:{self.index}-->"

    @property
    def tests_json(self) -> str:
        """The rerun workflow's ``tests`` input: a JSON list of argv lists (after ``python3``, inside test/).
        Never a shell string: the workflow runs each list as it is, and re-checks every name."""
        return json.dumps([test.argv for test in self.tests], separators=(",", ":"))


def group_by_runner(tests: list[ResolvedTest]) -> list[RunnerGroup]:
    """Groups in order of first appearance; a file named twice runs once."""
    by_key: dict[tuple[str, str], list[ResolvedTest]] = {}
    for test in tests:
        bucket = by_key.setdefault((test.runner, test.registration.backend), [])
        if test.command not in {t.command for t in bucket}:
            bucket.append(test)
    return [RunnerGroup(i, runner, backend, tuple(bucket))
            for i, ((runner, backend), bucket) in enumerate(by_key.items())]


def render_groups(groups: list[RunnerGroup]) -> str:
    return "\n\n".join(_group_block(group) for group in groups) + "\n"


def _group_block(group: RunnerGroup) -> str:
    count = len(group.tests)
    commands = "\n".join(f"cd test/ && python3 {test.command}" for test in group.tests)
    return (f"🚀 `{group.runner}` ({count} test{'s' if count != 1 else ''}): "
            f"{STATUS_ICONS['queued']} queued {group.marker}\n```\n{commands}\n```")


def render_refusals(refusals: list[tuple[str | None, str]], footer: str = "") -> str:
    """Refusals as reply lines; whatever the commenter wrote is echoed through ``shown`` (no mentions)."""
    lines, size = [], 0
    for count, (who, why) in enumerate(refusals):
        line = f"{REFUSED} {shown(who)}: {shown(why, 1000)}" if who else f"{REFUSED} {shown(why, 1000)}"
        if size + len(line) > MAX_REFUSAL_CHARS:
            lines.append(f"{REFUSED} ... and {len(refusals) - count} more refused")
            break
        lines.append(line)
        size += len(line)
    return "\n\n".join(lines + ([footer] if footer else [])) + "\n"


def line_status(body: str, marker: str) -> str | None:
    """The status the line carrying ``marker`` shows now (None: no such line)."""
    done = marker.replace("-->", ":done-->")
    for line in body.splitlines():
        if line.endswith(f" {marker}") or line.endswith(f" {done}"):
            for status, icon in STATUS_ICONS.items():
                if f": {icon} " in line:
                    return status
    return None


def set_status(body: str, marker: str, status: str, run_url: str | None = None, text: str | None = None) -> str:
    """``body`` with the line carrying ``marker`` moved to ``status``.

    A finished line gets a ``:done`` marker, so a late "running" update (the runner's beacon racing
    the finisher) or a repeated one leaves it alone.
    """
    icon = STATUS_ICONS[status]
    new_marker = marker.replace("-->", ":done-->") if status in TERMINAL else marker
    icons = "|".join(map(re.escape, STATUS_ICONS.values()))
    line = re.compile(rf"^(.*?): (?:{icons}) (.*?) {re.escape(marker)}$", re.MULTILINE)

    def updated(match: re.Match) -> str:
        shown_text = text or (f"[View workflow run]({run_url})" if run_url else match.group(2))
        return f"{match.group(1)}: {icon} {shown_text} {new_marker}"

    return line.sub(updated, body, count=1)
