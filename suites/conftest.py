"""pytest wiring for the measurement suites: options, the frozen config record, the output file.

Standalone:   pytest suites/ --base-url http://HOST:PORT [--dspark-out OUT.json] [...]
In a run:     python -m pytest suites/test_<name>.py --base-url URL --dspark-out OUT.json \
                  --suite-options OPTIONS.json -p no:cacheprovider
Without --base-url, collecting a suite test is a usage error (exit 4, as pytest's own), never a green run of
skipped tests that measured nothing; ``--collect-only`` still lists them.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import requests
from dspark_ci.suites.config import (
    RoleURL,
    SuiteConfig,
    SuiteInputError,
    freeze,
    load_options_file,
    merge_options,
    normalize_base_url,
)
from dspark_ci.suites.output import SuiteOutput
from dspark_ci.suites.server import NotTheServer, Server, connect

SUITES_DIR = Path(__file__).parent
CONFIG_KEY = pytest.StashKey[SuiteConfig]()
OUTPUT_KEY = pytest.StashKey[SuiteOutput]()
NO_SERVER = ("no server under test: pass --base-url http://HOST:PORT (an SGLang server; or start the simulated one "
             "with `dspark-ci sim --model-path m --port 30000`; see suites/README.md)")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dspark", "dspark-ci measurement suites")
    _add_base_url(group)
    group.addoption("--model", help="served model name (default: the first of /v1/models)")
    group.addoption("--api-key", default="EMPTY", help="API key sent to the server (default: EMPTY)")
    group.addoption("--request-timeout", type=float, default=3600.0,
                    help="seconds one request may take (default: 3600; thinking models are slow)")
    group.addoption("--suite-options", metavar="FILE.json",
                    help="JSON object: suite name -> options (docs/ARCHITECTURE.md)")
    group.addoption("--suite-option", action="append", default=[], metavar="SUITE.KEY=VALUE",
                    help="override one option, e.g. gpqa.repeats=4 (repeatable; VALUE is JSON or a string)")
    group.addoption("--dspark-out", metavar="OUT.json", help="write metrics, records and outcomes here")
    group.addoption("--dspark-progress", metavar="FILE", help="keep the requests done so far here (one line)")
    group.addoption("--gpqa-dataset", metavar="PATH|URL", help="GPQA CSV (overrides gpqa.dataset)")
    group.addoption("--reference-url", help="parity: the same deployment without speculation")
    group.addoption("--role-url", action="append", default=[], metavar="ROLE=URL",
                    help="a disaggregated deployment's prefill or decode server behind --base-url (repeatable): "
                         "speed splits TTFT by the stages it reports")
    group.addoption("--server-pid", action="append", default=[], type=int, metavar="PID",
                    help="a rank's root process on this machine (repeatable; `dspark-ci run` gives them): the speed "
                         "suite reads where its schedulers spent the window")
    group.addoption("--reference-file", metavar="FILE.json", help="parity: recorded reference outputs")
    group.addoption("--save-reference", metavar="FILE.json",
                    help="parity: write the outputs of --base-url as a reference file")
    group.addoption("--cache-dir", metavar="DIR", help="downloads (GPQA CSV); default ~/.cache/dspark-ci")


def _add_base_url(group) -> None:
    # pytest-base-url (pulled in by pytest-playwright/-selenium) registers the same option with
    # the same meaning; reuse it instead of failing on the duplicate.
    try:
        group.addoption("--base-url", help="the server under test, http://HOST:PORT")
    except ValueError:
        pass


def pytest_configure(config: pytest.Config) -> None:
    try:
        suite_config = _build_config(config)
    except SuiteInputError as err:
        raise pytest.UsageError(str(err)) from None
    config.stash[CONFIG_KEY] = suite_config
    config.stash[OUTPUT_KEY] = SuiteOutput()
    config.pluginmanager.register(OutputPlugin(config.stash[OUTPUT_KEY], suite_config.out_path),
                                  "dspark-suite-output")


def _build_config(config: pytest.Config) -> SuiteConfig:
    opt = config.option
    options_file = load_options_file(opt.suite_options) if opt.suite_options else None
    options = merge_options(options_file, list(opt.suite_option), opt.suite_options or "--suite-options")
    if opt.gpqa_dataset:
        options["gpqa"]["dataset"] = opt.gpqa_dataset
    if opt.reference_url and opt.reference_file:
        raise SuiteInputError("--reference-url and --reference-file: give one of them, not both")
    path_or_none = lambda value: Path(value) if value else None  # noqa: E731
    return SuiteConfig(
        base_url=normalize_base_url(opt.base_url) if opt.base_url else None,
        model=opt.model, api_key=opt.api_key, request_timeout=opt.request_timeout,
        options=freeze(options),
        reference_url=normalize_base_url(opt.reference_url) if opt.reference_url else None,
        reference_file=path_or_none(opt.reference_file), save_reference=path_or_none(opt.save_reference),
        cache_dir=Path(opt.cache_dir) if opt.cache_dir else Path.home() / ".cache" / "dspark-ci",
        out_path=path_or_none(opt.dspark_out), progress_path=path_or_none(opt.dspark_progress),
        roles=tuple(RoleURL.parse(flag) for flag in opt.role_url),
        server_pids=tuple(opt.server_pid),
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.stash[CONFIG_KEY].base_url or config.option.collectonly:
        return
    if any(SUITES_DIR in Path(item.path).parents for item in items):
        raise pytest.UsageError(NO_SERVER)


@pytest.fixture(scope="session")
def suite_config(pytestconfig: pytest.Config) -> SuiteConfig:
    return pytestconfig.stash[CONFIG_KEY]


@pytest.fixture(scope="session")
def suite_output(pytestconfig: pytest.Config) -> SuiteOutput:
    return pytestconfig.stash[OUTPUT_KEY]


@pytest.fixture(scope="session")
def server(suite_config: SuiteConfig) -> Server:
    try:
        return connect(suite_config)
    except NotTheServer as err:
        problem = str(err)
    pytest.fail(problem, pytrace=False)  # outside the except: one line, no chained traceback


# Errors of the server's API, as one line each: what a user needs is what the server said, not the client's stack.
API_ERRORS = (openai.OpenAIError, requests.RequestException)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if call.excinfo is not None and isinstance(call.excinfo.value, API_ERRORS) and report.failed:
        error = call.excinfo.value
        report.longrepr = f"{item.nodeid}: the server's API failed: {type(error).__name__}: {error}"
    if report.failed and Path(item.path).name == SANITY_MODULE:
        item.config.stash.setdefault(SANITY_FAILED_KEY, (item.nodeid, SANITY_STILL_MEASURED.get(item.name, ())))
    return report


# The sanity check runs first; once it fails, the server is known broken and the cell is red whatever the other
# suites measure: they are skipped at once (saying why), so the verdict does not wait minutes for them.
SANITY_MODULE = "test_sanity.py"
SANITY_FAILED_KEY = pytest.StashKey[tuple[str, tuple[str, ...]]]()
# But a draft collapse serves valid text: the server is not broken, its speculation is, and the accept suite's own
# figures (accept length, per position, per category) are the evidence a user acts on: that suite still measures.
SANITY_STILL_MEASURED = {"test_drafts_are_accepted": ("test_accept.py",)}


def pytest_runtest_setup(item: pytest.Item) -> None:
    failed, still_measured = item.config.stash.get(SANITY_FAILED_KEY, (None, ()))
    if failed is not None and Path(item.path).name not in (SANITY_MODULE, *still_measured):
        pytest.skip(f"not run: the sanity check failed ({failed}), so this cell is red whatever this suite measures")


class OutputPlugin:
    """Collects each test's outcome (like junitxml) and writes the suite output at session end."""

    def __init__(self, output: SuiteOutput, path: Path | None):
        self.output, self.path = output, path
        self._open: dict[str, dict] = {}  # nodeid -> outcome so far, until its teardown report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        state = self._open.setdefault(report.nodeid, {"outcome": "passed", "duration": 0.0, "message": None})
        state["duration"] += report.duration
        outcome = _phase_outcome(report)
        if outcome != "passed" and state["outcome"] == "passed":
            state["outcome"], state["message"] = outcome, _message(report)
        if report.when == "teardown":
            self.output.add_test(report.nodeid, **self._open.pop(report.nodeid))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.output.add_test(report.nodeid, "error", 0.0, _message(report))

    def pytest_sessionfinish(self) -> None:
        if self.path is not None:
            self.output.write(self.path)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.output.metrics:
            terminalreporter.section("dspark metrics")
            for name, value in sorted(self.output.metrics.items()):
                terminalreporter.write_line(f"{name:28} {value:.6g}")
        if self.output.warnings:
            terminalreporter.section("dspark warnings")
            for message in self.output.warnings:
                terminalreporter.write_line(message)


def _phase_outcome(report) -> str:
    if report.passed:
        return "passed"
    if report.skipped:
        return "skipped"
    return "failed" if report.when == "call" else "error"


def _message(report) -> str | None:
    if report.skipped and isinstance(report.longrepr, tuple):
        return report.longrepr[2].removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        # The first line is the assertion's own message; pytest's introspection of it follows.
        first = crash.message.splitlines()[0]
        return first.removeprefix("AssertionError: ").removeprefix("Failed: ")
    return str(report.longrepr).strip().splitlines()[-1] if report.longrepr else None
