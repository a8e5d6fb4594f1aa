"""Talking to the server under test: OpenAI clients and the native JSON endpoints.

Only what real SGLang 0.5.23 serves (http_server.py): ``/v1/*`` through the official ``openai``
client, ``/server_info`` and ``/metrics`` with plain HTTP.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, TypeVar

import openai
import requests
from prometheus_client.parser import text_string_to_metric_families

from suites.config import SuiteConfig

Item, Answer = TypeVar("Item"), TypeVar("Answer")


@dataclass(frozen=True)
class Server:
    """The server under test as the suites address it."""

    base_url: str  # "http://HOST:PORT"
    model: str
    api_key: str
    request_timeout: float

    @property
    def api_base(self) -> str:
        return f"{self.base_url}/v1"

    def client(self, max_retries: int = 0) -> openai.OpenAI:
        # No retries by default: a measurement must see the failure, not hide it behind a second try.
        return openai.OpenAI(base_url=self.api_base, api_key=self.api_key, timeout=self.request_timeout,
                             max_retries=max_retries)

    def ask_each(self, ask: Callable[[openai.OpenAI, Item], Answer], items: Iterable[Item], concurrency: int,
                 max_retries: int = 0) -> list[Answer]:
        """``ask(client, item)`` for every item, ``concurrency`` at a time on one client; answers in item order."""
        client = self.client(max_retries)
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            return list(pool.map(lambda item: ask(client, item), items))

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


def connect(config: SuiteConfig) -> Server:
    """The Server for ``config``; asks ``/v1/models`` for the model name when none was given."""
    model = config.model or _served_model(config)
    return Server(base_url=config.base_url, model=model, api_key=config.api_key,
                  request_timeout=config.request_timeout)


def _served_model(config: SuiteConfig) -> str:
    client = openai.OpenAI(base_url=config.api_base, api_key=config.api_key, timeout=30, max_retries=2)
    models = client.models.list().data
    if not models:
        raise RuntimeError(f"{config.base_url}/v1/models lists no model; pass --model NAME")
    return models[0].id
