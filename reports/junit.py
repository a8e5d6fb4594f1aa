"""junit.xml: one testsuite per cell, one testcase per suite the cell ran (and one per expected rejection),
valid against the common JUnit schema (Jenkins xunit's junit-10.xsd, which pytest's xunit2 output and
the GitHub test reporters follow).

- ``<testsuites>`` > ``<testsuite name=CELL>`` > ``<properties>`` (the cell's metrics: properties are
  allowed on a testsuite only, never inside a testcase) and ``<testcase classname=CELL name=SUITE time=S>``.
- A suite's testcase fails (``<failure>``) when one of its gates failed (gate lines, with where the
  threshold came from in results.json) or one of its pytest tests did; a cell that never got to measure
  has one testcase, ``launch``, with ``<error>`` and SGLang's own error line; a skipped cell one
  ``<skipped>`` testcase; an expected rejection one testcase, ``expected rejection``, passing with what
  SGLang said in ``<system-out>``.
- A quarantined cell (matrices/quarantine.py) still shows what happened: while its entry holds, a failure or error
  is written as ``<skipped type="quarantined">`` (the way pytest writes an xfail), its message naming the
  expiry, the ticket and what failed, its text the whole failure, so it counts neither as a failure nor as an
  error; once the entry has expired, the failure stays a failure and its message says the quarantine expired.
  The testsuite's properties carry the entry (``quarantine.reason``, ``.link``, ``.expires``, ``.entry``, ``.state``).
- Text from logs (an ANSI-coloured error line, a NUL) is made XML-safe first: colour sequences are dropped and
  any other character XML 1.0 cannot carry is written as ``\\xNN``, so the file always parses.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from datetime import datetime

from dspark_ci.ground.measurements import SuiteTestOutcome
from dspark_ci.ground.records import DECIDED_BY_RESOLVER, CellResult, GateResult, RunResults, Status
from dspark_ci.ground.suites import suite_of
from dspark_ci.reports.gates import describe_gate
from dspark_ci.reports.metrics import in_table_order
from dspark_ci.reports.results import error_headline, quarantine_line, rejection_message

LAUNCH_CASE = "launch"  # the testcase of a cell whose suites never ran
REJECTION_CASE = "expected rejection"
ANSI_SEQUENCE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# Characters XML 1.0 cannot carry (https://www.w3.org/TR/xml/#charsets).
NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: str) -> str:
    """``text`` as XML 1.0 can carry it: colour sequences dropped, other control characters as ``\\xNN``."""
    return NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", ANSI_SEQUENCE.sub("", text))


def render_junit(results: RunResults) -> str:
    suites = [_testsuite(cell) for cell in results.cells]
    if not results.complete:  # a snapshot of a run still going, killed or interrupted: never a green file
        suites.append(_unfinished_suite(results))
    totals = {key: str(sum(int(s.get(key, "0")) for s in suites)) for key in ("tests", "failures", "errors")}
    root = ET.Element("testsuites", {"name": xml_text(f"dspark-ci {results.run_id}".strip()), **totals,
                                     **_run_time(results)})
    root.extend(suites)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


RUN_CASE = "run finished"  # the testcase, in its own testsuite, of a run that did not finish


def _unfinished_suite(results: RunResults) -> ET.Element:
    why = ("the run was interrupted (Ctrl-C or SIGTERM) before it finished" if results.interrupted else
           "the run had not finished when this file was written; if it is not running any more, it was killed")
    suite = ET.Element("testsuite", {"name": "dspark-ci run", "tests": "1", "failures": "0", "errors": "1",
                                     "skipped": "0", "time": _seconds(0.0)})
    case = ET.SubElement(suite, "testcase", {"classname": "dspark-ci run", "name": RUN_CASE, "time": _seconds(0.0)})
    ET.SubElement(case, "error", {"type": "error", "message": why}).text = why
    return suite


def _run_time(results: RunResults) -> dict:
    try:
        started = datetime.fromisoformat(results.started_at or "")
        seconds = (datetime.fromisoformat(results.finished_at or "") - started).total_seconds()
    except ValueError:
        return {}
    return {"time": _seconds(seconds)}


def _seconds(value: float) -> str:
    return f"{max(value, 0.0):.3f}"


def _testsuite(cell: CellResult) -> ET.Element:
    cases = list(_testcases(cell))
    counts = {tag: sum(case.find(tag) is not None for case in cases) for tag in ("failure", "error", "skipped")}
    suite = ET.Element("testsuite", {"name": xml_text(cell.id), "tests": str(len(cases)),
                                     "failures": str(counts["failure"]), "errors": str(counts["error"]),
                                     "skipped": str(counts["skipped"]),
                                     "time": _seconds(_cell_seconds(cell, cases))})
    metrics = {name: value for name, value in cell.metrics.items() if value is not None}
    facts = {**_timing_properties(cell), **_quarantine_properties(cell)}
    if metrics or facts:
        properties = ET.SubElement(suite, "properties")
        for name, value in facts.items():
            ET.SubElement(properties, "property", {"name": name, "value": value})
        for name in in_table_order(metrics):
            ET.SubElement(properties, "property", {"name": xml_text(name), "value": repr(metrics[name])})
    suite.extend(cases)
    return suite


def _cell_seconds(cell: CellResult, cases: list[ET.Element]) -> float:
    """The cell's own wall time (start to result, boot and teardown included) when it was timed, else its cases'."""
    if cell.timing is not None and cell.timing.seconds is not None:
        return cell.timing.seconds
    return sum(float(case.get("time", "0")) for case in cases)


def _timing_properties(cell: CellResult) -> dict[str, str]:
    """When the cell started, was ready and finished, and its queue/boot/measure seconds, as far as known."""
    timing = cell.timing.to_dict() if cell.timing is not None else {}
    timing["boot_seconds"] = cell.boot_seconds
    order = ("started_at", "ready_at", "finished_at", "queue_seconds", "boot_seconds", "measure_seconds")
    return {name: (timing[name] if isinstance(timing[name], str) else repr(timing[name]))
            for name in order if timing.get(name) is not None}


def _quarantine_properties(cell: CellResult) -> dict[str, str]:
    entry = cell.quarantine
    if entry is None:
        return {}
    state = "held: not gating" if cell.quarantined else "expired: gates again"
    return {"quarantine.state": state, "quarantine.expires": entry.expires.isoformat(),
            "quarantine.link": xml_text(entry.link), "quarantine.reason": xml_text(entry.reason),
            "quarantine.entry": xml_text(entry.where)}


def _testcases(cell: CellResult) -> Iterable[ET.Element]:
    cases = _outcome_cases(cell)
    if cell.quarantined:
        return (_held(case, quarantine_line(cell)) for case in cases)
    if cell.quarantine_expired:
        return (_expired(case, quarantine_line(cell)) for case in cases)
    return cases


QUARANTINED_TYPE = "quarantined"  # the <skipped type=...> of a quarantined cell's failure


def _held(case: ET.Element, line: str) -> ET.Element:
    """A quarantined cell's testcase: a failure or error becomes <skipped type="quarantined">, still saying what
    failed and why, so it counts as neither."""
    for problem in [child for child in case if child.tag in ("failure", "error")]:
        case.remove(problem)
        what = "failed" if problem.tag == "failure" else "error"
        skipped = ET.SubElement(case, "skipped", {"type": QUARANTINED_TYPE,
                                                  "message": xml_text(f"{line} ({what}: {problem.get('message')})")})
        skipped.text = xml_text(f"{line}\n{what}:\n{problem.text or ''}")
    return case


def _expired(case: ET.Element, line: str) -> ET.Element:
    """An expired quarantine's testcase: its failure stays one, its message saying the quarantine no longer holds."""
    for problem in [child for child in case if child.tag in ("failure", "error")]:
        problem.set("message", xml_text(f"{line}: {problem.get('message')}"))
    return case


def _outcome_cases(cell: CellResult) -> Iterable[ET.Element]:
    if cell.expect.rejects or cell.status is Status.REJECTED_AS_EXPECTED:
        yield _rejection_case(cell)
    elif cell.status is Status.SKIPPED:
        case = _case(cell, LAUNCH_CASE, cell.boot_seconds)
        ET.SubElement(case, "skipped", {"message": xml_text(error_headline(cell) or "skipped")})
        yield case
    elif not (cell.tests or cell.gates or cell.metrics):
        # The suites never ran: a crash at boot, an infrastructure failure, a cell never reached.
        case = _case(cell, LAUNCH_CASE, cell.boot_seconds)
        if cell.status.failing:
            case.append(_problem("error" if cell.status is Status.ERROR else "failure", cell, cell.gates, []))
        yield case
    else:
        yield from _suite_cases(cell)


def _suite_cases(cell: CellResult) -> Iterable[ET.Element]:
    """One testcase per suite the cell ran, in the order the cell lists its suites."""
    tests_by_suite: dict[str, list[SuiteTestOutcome]] = {}
    for test in cell.tests or ():
        tests_by_suite.setdefault(test.suite, []).append(test)
    gates_by_suite: dict[str, list[GateResult]] = {}
    for gate in cell.gates:
        gates_by_suite.setdefault(suite_of(gate.metric) or "gates", []).append(gate)
    measured = {suite_of(metric) for metric in cell.metrics}
    names = list(dict.fromkeys([*cell.suites, *tests_by_suite, *gates_by_suite, *sorted(filter(None, measured))]))
    names = [name for name in names if name in tests_by_suite or name in gates_by_suite or name in measured]
    unplaced_error = cell.status.failing and bool(cell.error)
    for name in names:
        tests, gates = tests_by_suite.get(name, []), gates_by_suite.get(name, [])
        case = _case(cell, name, sum(t.duration for t in tests))
        failed_tests = [t for t in tests if t.failed]
        if failed_tests or any(not g.passed and not g.inconclusive for g in gates):
            case.append(_problem("failure", cell, gates, failed_tests))
        elif any(g.inconclusive for g in gates):  # neither green nor red: JUnit's nearest is "skipped"
            lines = [describe_gate(g) for g in gates if g.inconclusive]
            ET.SubElement(case, "skipped", {"message": xml_text("inconclusive: " + lines[0])}).text = xml_text(
                "\n".join(lines))
        yield case
    if unplaced_error and (cell.status is Status.ERROR or not names):  # stopped while measuring: a rank died
        case = _case(cell, LAUNCH_CASE, cell.boot_seconds)
        case.append(_problem("error", cell, [], []))
        yield case


def _case(cell: CellResult, name: str, seconds: float | None) -> ET.Element:
    return ET.Element("testcase", {"classname": xml_text(cell.id), "name": xml_text(name),
                                   "time": _seconds(seconds or 0.0)})


def _problem(tag: str, cell: CellResult, gates: Sequence[GateResult],
             failed_tests: list[SuiteTestOutcome]) -> ET.Element:
    """<failure>/<error>: the failed gates' lines and the failed tests' messages, or the cell's error with
    SGLang's own line."""
    lines = [describe_gate(gate) for gate in gates if not gate.passed]
    lines += [t.line for t in failed_tests]
    if lines:
        message = lines[0] if len(lines) == 1 else f"{lines[0]} (and {len(lines) - 1} more)"
    else:  # the cell's own error: its headline (with SGLang's line) as the message, all of it as the text
        message = error_headline(cell) or cell.status.text
        lines = [cell.error or message]
    element = ET.Element(tag, {"type": "gate" if gates and not failed_tests else tag, "message": xml_text(message)})
    element.text = xml_text("\n".join(lines))
    return element


def _rejection_case(cell: CellResult) -> ET.Element:
    case = _case(cell, REJECTION_CASE, cell.boot_seconds)
    said = rejection_message(cell)
    if cell.status is Status.REJECTED_AS_EXPECTED:
        how = " (decided by SGLang's resolver, not launched)" if cell.decided_by == DECIDED_BY_RESOLVER else ""
        ET.SubElement(case, "system-out").text = xml_text(f"rejected as expected{how}: {said}")
    elif cell.status.failing:
        case.append(_problem("failure" if cell.status is Status.FAILED else "error", cell, [], []))
    elif cell.status is Status.SKIPPED:
        ET.SubElement(case, "skipped", {"message": xml_text(error_headline(cell) or "skipped")})
    return case
