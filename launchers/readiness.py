"""Readiness as pluggable wait strategies, polled against our own deadline with tenacity.

A strategy answers one question — is the deployment ready? — and raises ``NotReady`` when not yet.
``wait_until_ready`` polls it, checks between polls that no rank has died (failing fast with that
rank's exit code and log instead of waiting out the deadline), and on timeout raises ``LaunchTimeout``
saying what was awaited, for how long, the last log lines and a hint. The deadline holds for the probe in
flight too: each probe's own timeout is cut to the time that is left.

``OurServer`` is the health check every launcher uses: rank 0's ``/health`` answering 200 is not enough, since
another run's server may hold the port; ``/server_info`` must report the arguments we launched with.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import tenacity
from dspark_ci.ground import interrupts
from dspark_ci.ground.errors import InfraError
from dspark_ci.ground.sglang.flags import load_flags
from dspark_ci.launchers.contract import LaunchTimeout
from dspark_ci.launchers.plan_types import LaunchPlan


class NotReady(Exception):
    """The awaited condition does not hold yet; the message says what was seen."""


class WaitStrategy(Protocol):
    def describe(self) -> str: ...

    def probe(self, timeout_s: float) -> None:
        """Return when ready; raise NotReady otherwise; never take longer than ``timeout_s``."""


@dataclass(frozen=True)
class HttpOk:
    """An HTTP GET answering 200: ``/health`` (SGLang's liveness) or ``/health_generate`` (one real token)."""

    url: str
    request_timeout_s: float = 5.0

    def describe(self) -> str:
        return f"HTTP 200 from {self.url}"

    def probe(self, timeout_s: float) -> None:
        import requests  # on use: `dspark-ci run` reaches its first launch without paying for its import

        try:
            response = requests.get(self.url, timeout=max(0.1, min(self.request_timeout_s, timeout_s)))
        except requests.RequestException as err:
            raise NotReady(f"{type(err).__name__}") from None
        if response.status_code != 200:
            raise NotReady(f"HTTP {response.status_code}")


# launch_server arguments /server_info must echo back for a server to be ours (dests of SGLang's flags). Only
# fields SGLang's resolution never rewrites: it turns NEXTN into EAGLE and derives DP sizes, so those are left out.
IDENTITY_FIELDS = ("model_path", "served_model_name", "port", "tp_size", "nnodes")


@dataclass(frozen=True)
class OurServer:
    """Rank 0 healthy, and the server answering is the one we launched: its /server_info reports our argv's
    model, port and parallel layout. Anything else on the port is an infrastructure error, never a pass."""

    plan: LaunchPlan
    request_timeout_s: float = 5.0

    def describe(self) -> str:
        return f"HTTP 200 from {self.plan.health_url} (and /server_info reporting our launch arguments)"

    def probe(self, timeout_s: float) -> None:
        import requests  # as in HttpOk.probe

        HttpOk(self.plan.health_url, self.request_timeout_s).probe(timeout_s)
        try:
            response = requests.get(f"{self.plan.base_url}/server_info",
                                    timeout=max(0.1, min(self.request_timeout_s, timeout_s)))
            reported = response.json() if response.status_code == 200 else None
        except (requests.RequestException, ValueError):
            reported = None
        if not isinstance(reported, dict):
            raise InfraError(f"{self.plan.base_url} answers /health but not SGLang's /server_info: another program "
                             "holds the port; check what listens there, or run again (ports are chosen per run)")
        differing = [f"{name}={reported.get(name)!r} (we launched {value!r})"
                     for name, value in launched_fields(self.plan.ranks[0].argv).items()
                     if str(reported.get(name)) != value]
        if differing:
            raise InfraError(f"the server at {self.plan.base_url} is not the one this run launched: "
                             f"{', '.join(differing)}; another run or server holds the port")


def launched_fields(argv: Sequence[str]) -> dict[str, str]:
    """The IDENTITY_FIELDS an argv sets, by SGLang's field name (any spelling of the flag)."""
    flags = load_flags()
    fields = {}
    for token, value in zip(argv, argv[1:], strict=False):
        flag = flags.get(token) if token.startswith("--") else None
        if flag is not None and flag.dest in IDENTITY_FIELDS and flag.kind == "value":
            fields[flag.dest] = value
    return fields


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
        interrupts.check()  # a Ctrl-C Python dropped still stops the wait
        check_alive()
        try:
            strategy.probe(deadline.timeout_s - (time.monotonic() - started))
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
