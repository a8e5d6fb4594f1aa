"""No file on disk says PASSED unless the run really finished and wrote its whole final set: a SIGKILL or
Ctrl-C after the last cell, while the final files are being written, and an --out that cannot be written any more
then, each leave red files; an interrupted run says so (results.json `interrupted`, no `finished_at`, exit 130).
bench/kill_runs.py does the same at random moments, 20 SIGKILLs and 20 SIGINTs."""

from __future__ import annotations

import signal
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.test_run_cli import ONE_NODE, REJECTED, SMOKE
from tests.test_verdicts import GREEN, RED, VerdictRun, wait_for

# Runs `dspark-ci run` as the CLI does, with the final set's writing slowed down (so that a signal lands while it
# is going on) or failing as a directory turned read-only would make it fail.
DRIVER = """
import errno, sys, time
from unittest import mock
import dspark_ci.reports.writers as writers
from dspark_ci.cli import main

how, argv = sys.argv[1], sys.argv[2:]
render, write = writers.render_reports, writers.write_files_atomically

slowed = []

def slow_render(*args, **kwargs):  # report.html's charts take a while: the final set is rendered before it is written
    if not slowed:  # a signal meanwhile is acted on once it is rendered: rendered again, as an interrupted run's
        slowed.append(True)
        open(argv[argv.index("--out") + 1] + "/.final-set-started", "w").close()
        time.sleep(8)  # the test sees the marker and signals within this, even on a loaded machine
    return render(*args, **kwargs)

def read_only(files):
    if any(path.name == "report.html" for path in files):  # only the final set has report.html
        raise OSError(errno.EROFS, "Read-only file system")
    return write(files)

def interrupt_in_a_gc_callback(original):
    # The signal lands while a weakref callback runs, where Python drops an exception raised from a handler
    # ("Exception ignored in ... KeyboardInterrupt"): the run must still end interrupted.
    def wrapped(*args, **kwargs):
        class Dropped:
            pass

        def callback(_ref):
            os.kill(os.getpid(), getattr(signal, how.split("-")[1]))
            time.sleep(0.05)  # the handler runs here, inside the callback

        thing = Dropped()
        keep = weakref.ref(thing, callback)
        del thing
        assert keep() is None
        return original(*args, **kwargs)
    return wrapped

import os, signal, weakref
import dspark_ci.reports.live_results as live_results
import dspark_ci.suite_runner as runner
if how.startswith("gc-"):
    where, name = (live_results.ResultsWriter, "finish") if how.endswith("-late") else (runner, "_report_progress")
    patch = mock.patch.object(where, name, interrupt_in_a_gc_callback(getattr(where, name)))
else:
    patch = mock.patch.object(writers, *(("render_reports", slow_render) if how == "slow" else
                                         ("write_files_atomically", read_only)))
with patch:
    sys.exit(main(argv))
"""


def driven(tmp_path, how: str) -> VerdictRun:
    # The sanity suite alone: what is under test is the final files and the signals, after or while a cell measures
    run = VerdictRun(tmp_path, SMOKE, "--cell", ONE_NODE, "--cell", REJECTED, "--suites", "sanity")
    run.argv = [sys.executable, "-c", DRIVER, how, *run.argv[3:]]
    return run


def junit_is_green(run: VerdictRun) -> bool:
    root = ET.parse(run.out / "junit.xml").getroot()
    return int(root.get("tests")) > 0 and root.get("failures") == "0" and root.get("errors") == "0"


@pytest.mark.parametrize("sig, code", [(signal.SIGKILL, -9), (signal.SIGINT, 130), (signal.SIGTERM, 130)],
                         ids=["sigkill", "ctrl-c", "sigterm"])
def test_a_signal_after_the_last_cell_leaves_no_green_file(tmp_path, sig, code):
    run = driven(tmp_path, "slow")
    process = run.start()
    try:
        wait_for(lambda: (run.out / ".final-set-started").exists(), "the final files to be written", timeout=120)
        assert len(run.lines()) == 2  # every cell has its outcome: only the final files are missing
        process.send_signal(sig)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == code, output
    assert GREEN not in run.report() and RED in run.report()
    assert not junit_is_green(run)
    html = run.out / "report.html"
    if sig == signal.SIGKILL:
        assert not html.exists()
    else:  # an interrupted run writes its whole final set, red
        assert "FAILED" in html.read_text() and "PASSED</strong>" not in html.read_text()
    results = run.results()
    assert results["finished_at"] is None  # nothing claims the run completed
    if sig != signal.SIGKILL:
        assert results["interrupted"] is True and "interrupted" in run.report()
        assert [c["status"] for c in results["cells"]] == ["passed", "rejected_as_expected"]  # what was measured
    run.assert_nothing_left()


def test_an_out_dir_that_cannot_be_written_at_the_end_leaves_no_green_report(tmp_path):
    run = driven(tmp_path, "read-only")
    done = run()
    assert done.returncode != 0, done.stderr
    assert "Read-only file system" in done.stderr
    assert GREEN not in run.report() and not junit_is_green(run)


def test_a_run_that_finishes_writes_the_whole_set_green(tmp_path):
    run = VerdictRun(tmp_path, SMOKE, "--cell", REJECTED)
    done = run()
    assert done.returncode == 0, done.stderr
    assert GREEN in run.report() and junit_is_green(run) and (run.out / "report.html").exists()
    assert run.results()["finished_at"] and "interrupted" not in run.results()
    assert not list(run.out.glob(".*.tmp"))  # no staged file left behind



@pytest.mark.parametrize("how", ["gc-SIGINT-late", "gc-SIGTERM-late", "gc-SIGINT-measuring", "gc-SIGTERM-measuring"])
def test_a_signal_python_drops_in_a_gc_callback_still_interrupts_the_run(tmp_path, how):
    """After the last cell, and while the suites measure: exit 130, results.json `interrupted`, nothing green."""
    run = driven(tmp_path, how)
    done = run()
    assert done.returncode == 130, done.stderr
    results = run.results()
    assert results["interrupted"] is True and results["finished_at"] is None, done.stderr
    assert GREEN not in run.report() and RED in run.report() and not junit_is_green(run)
    run.assert_nothing_left()
