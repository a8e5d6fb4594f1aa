"""A disaggregated cell's prefill that holds routed requests and finishes none: it stalled.

Such a prefill still answers /health (SGLang's health check takes a fake-bootstrap path) and its process lives, so
neither rank watch sees it; the decode side waits for a transfer that never comes (SGLang's decode for
SGLANG_DISAGGREGATION_WAITING_TIMEOUT, minutes), and every request through the router hangs until the suites'
own timeout. Its /metrics (``--enable-metrics``) say it: requests waiting or running in its scheduler
(``sglang:num_queue_reqs`` + ``sglang:num_running_reqs``) and its finished count (``sglang:num_requests_total``)
not moving. A prefill finishes every request at its first token, so holding requests for PREFILL_STALL_S without
finishing one is never a long prompt's prefill; a decode holds requests for a whole generation, so only prefills are
watched.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

# Past the 30 s within which an idle SGLang scheduler sets its gauges again (check_memory: "During idle time, also
# collect metrics every 30 seconds"; until then they hold the last batch's counts), and inside the suites'
# per-request timeout (dspark_ci.suite_runner: 60 s plus 0.25 s a token): the cell goes red naming the prefill before
# its requests would time out one by one.
PREFILL_STALL_S = 40.0
HELD = ("sglang:num_queue_reqs", "sglang:num_running_reqs")
FINISHED = "sglang:num_requests_total"


@dataclass(frozen=True)
class PrefillLoad:
    """One read of a prefill's /metrics: the requests its scheduler holds, and how many it finished so far."""

    held: float
    finished: float


def prefill_load(text: str) -> PrefillLoad | None:
    """The load in a Prometheus exposition (summed over DP ranks and labels); None without the families."""
    from prometheus_client.parser import text_string_to_metric_families  # on use, as requests below

    held = finished = 0.0
    seen = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in HELD:
                held, seen = held + sample.value, True
            elif sample.name == FINISHED:
                finished += sample.value
    return PrefillLoad(held, finished) if seen else None


@dataclass
class StallClock:
    """Since when a prefill has held requests without finishing one (None: it is idle or making progress)."""

    since: float | None = None
    finished: float | None = None

    def observe(self, load: PrefillLoad | None, now: float) -> None:
        progressed = load is not None and load.finished != self.finished
        if load is None or load.held <= 0 or progressed:
            self.since = None
        elif self.since is None:
            self.since = now
        self.finished = load.finished if load is not None else None

    def stalled_for(self, now: float) -> float:
        return 0.0 if self.since is None else now - self.since


class PrefillWatch:
    """Reads one prefill's /metrics every ``poll_s`` in its own thread (a hung server never delays the rank checks)."""

    def __init__(self, base_url: str, poll_s: float = 1.0, timeout_s: float = 5.0):
        self.base_url, self._poll_s, self._timeout_s = base_url, poll_s, timeout_s
        self.clock = StallClock()
        self.last: PrefillLoad | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        threading.Thread(target=self._run, name=f"prefill watch {base_url}", daemon=True).start()

    def stalled_for(self) -> float:
        with self._lock:
            return self.clock.stalled_for(time.monotonic())

    def stop(self) -> None:
        self._done.set()

    def _run(self) -> None:
        while not self._done.is_set():
            load = self._read()
            with self._lock:
                self.last = load
                self.clock.observe(load, time.monotonic())
            self._done.wait(self._poll_s)

    def _read(self) -> PrefillLoad | None:
        import requests  # on use: `dspark-ci run` reaches its first launch without paying for requests' import

        try:
            response = requests.get(f"{self.base_url}/metrics", timeout=self._timeout_s)
        except requests.RequestException:
            return None  # not answering is the health probe's and the rank watch's to judge
        return prefill_load(response.text) if response.status_code == 200 else None
