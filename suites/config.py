"""The suites' configuration: one frozen record built from the pytest command line, passed to fixtures.

Each suite's options start from the defaults in ``ground/suites.py`` (the one registry of suites and options);
``--suite-options FILE.json`` (suite name -> options, as ``dspark-ci run`` writes it) and repeated
``--suite-option SUITE.KEY=VALUE`` override them. Unknown suites or keys, and values of the wrong type,
are input errors (``SuiteInputError``), reported once by conftest.py as a pytest usage error.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dspark_ci.ground.suites import SUITE_DEFAULTS, effective_options, option_problem


class SuiteInputError(Exception):
    """Bad suite input (options, dataset, reference file). ``str()`` is the whole message for the user."""


ROLES = ("prefill", "decode")  # a disaggregated deployment's servers behind its router


@dataclass(frozen=True)
class RoleURL:
    """One server of a disaggregated deployment, addressed directly (its /metrics), beside the router."""

    role: str  # one of ROLES
    base_url: str

    @classmethod
    def parse(cls, flag: str) -> RoleURL:
        """``--role-url ROLE=URL``. Raises SuiteInputError."""
        role, sep, url = flag.partition("=")
        if not sep or role not in ROLES or not url:
            raise SuiteInputError(f"--role-url {flag}: expected ROLE=URL with ROLE one of {', '.join(ROLES)}, "
                                  "e.g. prefill=http://10.0.0.1:30000")
        return cls(role, normalize_base_url(url))


@dataclass(frozen=True)
class SuiteConfig:
    base_url: str | None  # the server under test, "http://HOST:PORT" (no /v1)
    model: str | None  # served model name; None = ask /v1/models
    api_key: str
    request_timeout: float  # seconds, per request
    options: Mapping[str, Mapping[str, Any]]  # suite name -> full option set
    reference_url: str | None = None
    reference_file: Path | None = None
    save_reference: Path | None = None
    cache_dir: Path = Path.home() / ".cache" / "dspark-ci"
    out_path: Path | None = None
    progress_path: Path | None = None  # --dspark-progress: requests done so far (dspark_ci.suites.progress_file)
    roles: tuple[RoleURL, ...] = ()  # --role-url: a disaggregated deployment's servers (the speed suite's TTFT split)
    # --server-pid: the root process of each rank on this machine (the launcher's; the speed suite reads where its
    # schedulers spent the window, dspark_ci.suites.offcpu); none when run standalone against a URL
    server_pids: tuple[int, ...] = ()

    def suite(self, name: str) -> Mapping[str, Any]:
        return self.options[name]

    @property
    def api_base(self) -> str:
        return f"{self.base_url}/v1"


def normalize_base_url(url: str) -> str:
    """Accept "http://h:p", "http://h:p/" or "http://h:p/v1" alike."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def merge_options(from_file: Mapping[str, Any] | None, from_flags: list[str], where_file: str) -> dict:
    """Defaults (a scorer's own for what is left unset: dspark_ci.ground.suites.effective_options), then the options
    file, then ``SUITE.KEY=VALUE`` flags. Raises SuiteInputError."""
    given: dict[str, dict[str, Any]] = {suite: {} for suite in SUITE_DEFAULTS}
    for suite, options in (from_file or {}).items():
        if not isinstance(options, Mapping):
            raise SuiteInputError(f"{where_file}: suite '{suite}' must map option names to values")
        for key, value in options.items():
            _set_option(given, suite, key, value, where_file)
    for flag in from_flags:
        suite, key, value = _parse_flag(flag)
        _set_option(given, suite, key, value, f"--suite-option {flag}")
    return {suite: effective_options(suite, options) for suite, options in given.items()}


MAX_OPTIONS_FILE_BYTES = 1 << 20  # suite options are a few hundred bytes; past this it is another file


def load_options_file(path: str) -> dict:
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_OPTIONS_FILE_BYTES:
            raise SuiteInputError(f"--suite-options {path}: not a JSON file of at most {MAX_OPTIONS_FILE_BYTES} "
                                  f"bytes")
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise SuiteInputError(f"--suite-options {path}: cannot read it ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise SuiteInputError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(data, dict):
        raise SuiteInputError(f"{path}: expected a JSON object of suite name -> options")
    return data


def _parse_flag(flag: str) -> tuple[str, str, Any]:
    name, sep, raw = flag.partition("=")
    suite, dot, key = name.partition(".")
    if not (sep and dot and suite and key):
        raise SuiteInputError(f"--suite-option {flag}: expected SUITE.KEY=VALUE, e.g. gpqa.repeats=4")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw  # a bare string such as a path
    return suite, key, value


def _set_option(merged: dict, suite: str, key: str, value: Any, where: str) -> None:
    problem = option_problem(suite, key, value)
    if problem:
        raise SuiteInputError(f"{where}: {problem}")
    merged[suite][key] = value


def freeze(options: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Mapping[str, Any]]:
    return MappingProxyType({suite: MappingProxyType(dict(opts)) for suite, opts in options.items()})
