"""How the simulator dies, looking like SGLang does: a traceback tail ending in ``<Type>: <message>``.

Launchers and people read the last such line (dspark_ci.ground.sglang.release.sglang_error_line), so it is always last.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn, TextIO

SGLANG_ROOT = "/usr/local/lib/python3.12/dist-packages/sglang"

# where each failure surfaces in SGLang, outermost first (file under sglang/, function)
LAUNCH_FRAMES = (("launch_server.py", "<module>"), ("launch_server.py", "run_server"),
                 ("srt/server_args.py", "resolve_once"), ("srt/arg_groups/pipeline.py", "run_resolution_pipeline"))
SCHEDULER_FRAMES = (("srt/managers/scheduler.py", "run_scheduler_process"),
                    ("srt/managers/scheduler.py", "event_loop_overlap"),
                    ("srt/managers/scheduler.py", "run_batch"))


def traceback_tail(frames: tuple[tuple[str, str], ...], error_line: str) -> list[str]:
    lines = ["Traceback (most recent call last):"]
    lines += [f'  File "{SGLANG_ROOT}/{path}", in {function}' for path, function in frames]
    return lines + [error_line]


def rejection_traceback(hook: str, error_line: str) -> list[str]:
    """The tail SGLang prints when its argument resolution raises in ``hook`` ("file.py:function")."""
    path, _, function = hook.partition(":")
    return traceback_tail(LAUNCH_FRAMES + ((f"srt/arg_groups/{path}", function),), error_line)


def print_lines(lines: list[str], stream: TextIO | None = None) -> None:
    sys.stdout.flush()
    print("\n".join(lines), file=stream or sys.stderr, flush=True)


def die(lines: list[str], code: int = 1) -> NoReturn:
    """End the process now, as a crashed SGLang does (no graceful shutdown, connections just drop)."""
    print_lines(lines)
    os._exit(code)
