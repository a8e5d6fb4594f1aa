"""Looking at the process table, as a user checking for orphans would (ps | grep)."""

from __future__ import annotations

import time

import psutil


def processes_mentioning(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def assert_none_left(marker: str, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while processes_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = processes_mentioning(marker)
    assert not left, f"processes left behind: {[p.info['cmdline'] for p in left]}"


def processes_with_env(name: str, value: str) -> list[psutil.Process]:
    """Processes whose environment carries NAME=VALUE: everything a run started inherits the caller's."""
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.environ().get(name) == value:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def assert_no_process_with_env(name: str, value: str, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while processes_with_env(name, value) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = processes_with_env(name, value)
    assert not left, f"processes left behind: {[p.cmdline() for p in left]}"
