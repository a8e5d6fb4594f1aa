"""Talking to the server under test: OpenAI clients and the native JSON endpoints.

Only what real SGLang serves (http_server.py): ``/v1/*`` through the official ``openai``
client, ``/server_info`` and ``/metrics`` with plain HTTP.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import requests
from dspark_ci.suites.config import SuiteConfig
from dspark_ci.suites.progress_file import ProgressFile
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    import openai

Item = TypeVar("Item")
Answer = TypeVar("Answer")


@dataclass(frozen=True)
class Server:
    """The server under test as the suites address it."""

    base_url: str  # "http://HOST:PORT"
    model: str
    api_key: str
    request_timeout: float
    progress_path: Path | None = None  # where ask_each reports requests done (dspark_ci.suites.progress_file)

    @property
    def api_base(self) -> str:
        return f"{self.base_url}/v1"

    def client(self, max_retries: int = 0) -> openai.OpenAI:
        # No retries by default: a measurement must see the failure, not hide it behind a second try.
        import openai  # on use: the speed suite's aiohttp client and the run itself never pay its 1.5 s import

        return openai.OpenAI(base_url=self.api_base, api_key=self.api_key, timeout=self.request_timeout,
                             max_retries=max_retries)

    def ask_each(self, ask: Callable[[openai.OpenAI, Item], Answer], items: Iterable[Item], concurrency: int,
                 max_retries: int = 0, label: str = "requests") -> list[Answer]:
        """``ask(client, item)`` for every item, ``concurrency`` at a time on one client; answers in item order.
        How many are done is reported under ``label`` (dspark_ci.suites.progress_file). Ctrl-C stops the requests and
        goes on."""
        answers, interrupted = self.ask_until_interrupted(ask, items, concurrency, max_retries, label)
        if interrupted:
            raise KeyboardInterrupt
        return answers

    def ask_until_interrupted(self, ask: Callable[[openai.OpenAI, Item], Answer], items: Iterable[Item],
                              concurrency: int, max_retries: int = 0, label: str = "requests",
                              on_answer: Callable[[Answer], str | None] = lambda _answer: None,
                              ) -> tuple[list[Answer], bool]:
        """(answers so far in item order, interrupted). ``on_answer`` sees each answer as it lands (in the calling
        thread) and may return a note for the progress line (e.g. GPQA's running accuracy). Ctrl-C stops at once:
        queued items are dropped, in-flight requests cut (their client closed), the answers so far returned."""
        client = self.client(max_retries)
        items = list(items)
        progress = ProgressFile(self.progress_path, label, len(items))
        pool = ThreadPoolExecutor(max_workers=concurrency)
        futures = {pool.submit(ask, client, item): index for index, item in enumerate(items)}
        answers: dict[int, Answer] = {}
        try:
            for future in as_completed(futures):
                answers[futures[future]] = answer = future.result()
                progress.advance(on_answer(answer))
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            client.close()
            return [answers[i] for i in sorted(answers)], True
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return [answers[i] for i in sorted(answers)], False

    def get_json(self, path: str) -> dict[str, Any] | None:
        """GET a native endpoint; None when the server does not serve it (404) or it is not JSON."""
        response = requests.get(f"{self.base_url}{path}", timeout=30)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        try:
            return response.json()
        except ValueError:
            return None

    def metrics_samples(self) -> dict[str, float] | None:
        """Prometheus ``/metrics`` summed over label sets (name -> value); None without --enable-metrics."""
        response = requests.get(f"{self.base_url}/metrics", timeout=30)
        if response.status_code != 200:
            return None
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        return totals


class NotTheServer(Exception):
    """Nothing answers at --base-url, or what answers is not an OpenAI-compatible (SGLang) server: one line."""


def connect(config: SuiteConfig) -> Server:
    """The Server for ``config``, once ``/v1/models`` proved it an OpenAI-compatible server (its first model is the
    model, unless --model names one). Raises NotTheServer saying what was found instead."""
    if config.base_url is None:
        raise NotTheServer("no server to test: pass --base-url http://HOST:PORT")
    models = _served_models(config)
    if not models and not config.model:
        raise NotTheServer(f"{config.base_url}/v1/models lists no model; pass --model NAME")
    return Server(base_url=config.base_url, model=config.model or models[0], api_key=config.api_key,
                  request_timeout=config.request_timeout, progress_path=config.progress_path)


def _served_models(config: SuiteConfig) -> list[str]:
    url = f"{config.api_base}/models"
    headers = {"Authorization": f"Bearer {config.api_key}"}
    try:
        response = requests.get(url, headers=headers, timeout=30)
    except requests.RequestException as err:
        found = re.search(r"\[Errno -?\d+\] [^'\"()]+", str(err))  # the socket's own reason, if there is one
        reason = found.group(0).strip() if found else type(err).__name__
        raise NotTheServer(f"cannot reach the server at {config.base_url}: {reason}") from None
    try:
        listing = response.json() if response.status_code == 200 else None
    except ValueError:
        listing = None
    if not isinstance(listing, dict) or not isinstance(listing.get("data"), list):
        served_by = ", ".join(part for part in (response.headers.get("Server"), response.headers.get("Content-Type"))
                              if part) or "no Server header"
        raise NotTheServer(f"{config.base_url} answers, but not as an OpenAI-compatible SGLang server: GET {url} gave "
                           f"HTTP {response.status_code} ({served_by}), not a model list; check --base-url")
    return [str(entry["id"]) for entry in listing["data"] if isinstance(entry, dict) and "id" in entry]
