"""Readiness as pluggable wait strategies, polled against our own deadline with tenacity.

A strategy answers one question — is the deployment ready? — and raises ``NotReady`` when not yet.
``wait_until_ready`` polls it, checks between polls that no rank has died (failing fast with that
rank's exit code and log instead of waiting out the deadline), and on timeout raises ``LaunchTimeout``
saying what was awaited, for how long, the last log lines and a hint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

import requests
import tenacity

from launchers.contract import LaunchTimeout


class NotReady(Exception):
    """The awaited condition does not hold yet; the message says what was seen."""


class WaitStrategy(Protocol):
    def describe(self) -> str: ...

    def probe(self) -> None:
        """Return when ready; raise NotReady otherwise."""


@dataclass(frozen=True)
class HttpOk:
    """An HTTP GET answering 200: ``/health`` (SGLang's liveness) or ``/health_generate`` (one real token)."""

    url: str
    request_timeout_s: float = 5.0

    def describe(self) -> str:
        return f"HTTP 200 from {self.url}"

    def probe(self) -> None:
        try:
            response = requests.get(self.url, timeout=self.request_timeout_s)
        except requests.RequestException as err:
            raise NotReady(f"{type(err).__name__}") from None
        if response.status_code != 200:
            raise NotReady(f"HTTP {response.status_code}")


@dataclass(frozen=True)
class Deadline:
    timeout_s: float
    poll_s: float = 0.5


def wait_until_ready(
    strategy: WaitStrategy,
    deadline: Deadline,
    check_alive: Callable[[], None],
    *,
    cell_id: str,
    last_lines: Callable[[], list[str]] = lambda: [],
) -> float:
    """Block until ``strategy`` is satisfied; return the seconds it took.

    ``check_alive`` raises (LaunchFailed) as soon as any rank has exited: that is never retried.
    """
    started = time.monotonic()
    last_seen = ["nothing yet"]

    def attempt() -> None:
        check_alive()
        try:
            strategy.probe()
        except NotReady as err:
            last_seen[0] = str(err)
            raise

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(NotReady),
        stop=tenacity.stop_after_delay(deadline.timeout_s),
        wait=tenacity.wait_fixed(deadline.poll_s),
        reraise=False,
    )
    try:
        retrying(attempt)
    except tenacity.RetryError:
        raise LaunchTimeout(
            cell_id=cell_id, reason="timeout", node_rank=0, last_lines=last_lines(),
            hint=(f"waited {deadline.timeout_s:g}s for {strategy.describe()} (last: {last_seen[0]}); "
                  "real models take minutes to load: raise --boot-timeout, or read the rank logs"),
        ) from None
    return time.monotonic() - started
