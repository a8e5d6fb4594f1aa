"""junit.xml: one testsuite per run, one testcase per cell, for CI test-result viewers.

failed → <failure> listing the failed gates (and the error, if any); error → <error> with SGLang's
message; skipped → <skipped>. A cell's metrics ride along as testcase <properties>, which
pytest's ``record_property`` also uses and most viewers show.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime

from ground.records import CellResult, RunResults, Status
from reports.gates import describe_gate
from reports.metrics import in_table_order
from reports.results import error_headline, rejection_message

CLASSNAME = "dspark-ci"


def render_junit(results: RunResults) -> str:
    cells = results.cells
    counts = {status.value: sum(cell.status is status for cell in cells)
              for status in (Status.FAILED, Status.ERROR, Status.SKIPPED)}
    suite = ET.Element("testsuite", {
        "name": f"dspark-ci {results.run_id}".strip(), "tests": str(len(cells)),
        "failures": str(counts["failed"]), "errors": str(counts["error"]), "skipped": str(counts["skipped"]),
        **_timing(results),
    })
    for cell in cells:
        suite.append(_testcase(cell))
    root = ET.Element("testsuites", {key: suite.get(key) for key in ("name", "tests", "failures", "errors")})
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _timing(results: RunResults) -> dict:
    try:
        started = datetime.fromisoformat(results.started_at)
        seconds = (datetime.fromisoformat(results.finished_at) - started).total_seconds()
    except (TypeError, ValueError):
        return {}
    return {"timestamp": results.started_at, "time": f"{seconds:.3f}"}


def _testcase(cell: CellResult) -> ET.Element:
    testcase = ET.Element("testcase", {"classname": CLASSNAME, "name": cell.id})
    metrics = {name: value for name, value in cell.metrics.items() if value is not None}
    if metrics:
        properties = ET.SubElement(testcase, "properties")
        for name in in_table_order(metrics):
            ET.SubElement(properties, "property", {"name": name, "value": repr(metrics[name])})
    outcome = _OUTCOMES.get(cell.status)
    if outcome:
        testcase.append(outcome(cell))
    if rejection_message(cell):
        ET.SubElement(testcase, "system-out").text = f"rejected as expected: {rejection_message(cell)}"
    return testcase


def _failure(cell: CellResult) -> ET.Element:
    failed = [describe_gate(gate) for gate in cell.gates if not gate.passed]
    message = "; ".join(failed) or error_headline(cell) or "failed"
    element = ET.Element("failure", {"type": "gate" if failed else "failure", "message": message})
    element.text = "\n".join(failed + ([cell.error] if cell.error else []))
    return element


def _error(cell: CellResult) -> ET.Element:
    element = ET.Element("error", {"type": "error", "message": error_headline(cell) or "error"})
    element.text = cell.error or ""
    return element


def _skipped(cell: CellResult) -> ET.Element:
    return ET.Element("skipped", {"message": error_headline(cell) or "skipped"})


_OUTCOMES = {Status.FAILED: _failure, Status.ERROR: _error, Status.SKIPPED: _skipped}
