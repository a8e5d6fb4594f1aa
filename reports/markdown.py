"""report.md and the GitHub step summary: a release-qualification report in markdown.

``step_summary`` is the short form (verdict, one row per cell, what failed and why), fit for
``$GITHUB_STEP_SUMMARY``; ``render_markdown`` adds a section per cell with SGLang-style tables
(``Model | Dataset | Metric | n | value`` and ``Avg Lat | Avg TTFT | Avg TPOT | Avg Thpt | ...``)
and where each gate's threshold comes from.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from datetime import datetime

from dspark_ci.ground.records import (
    DECIDED_BY_RESOLVER,
    QUARANTINE_EXPIRED,
    QUARANTINED,
    CellResult,
    RunResults,
    Status,
)
from dspark_ci.ground.servers import SIMULATED_SERVERS
from dspark_ci.ground.sglang.settings import summary_items
from dspark_ci.ground.suites import SUITE_DEFAULTS
from dspark_ci.reports.acceptance import acceptance_section, envelope_section
from dspark_ci.reports.baseline_file import Baseline
from dspark_ci.reports.gates import describe_gate, explain, levels_line
from dspark_ci.reports.metrics import SPEED_DETAIL, SPEED_LINE, STDERR_OF, TTFT_SPLIT, format_value, label
from dspark_ci.reports.results import error_headline, quarantine_line, rejection_message

OVERVIEW_METRICS = ("accept_length", "output_throughput_tok_s", "ttft_ms_mean", "tpot_ms_mean", "gpqa_accuracy")
# Quality rows of a cell's first table: metric -> (dataset, metric label)
QUALITY_ROWS = {
    "gpqa_accuracy": ("GPQA", "Accuracy"),
    "mc_accuracy": ("MC (log-likelihood)", "Accuracy"),
    "accept_length": ("accept", "Accept length"),
    "accept_rate": ("accept", "Accept rate"),
    "parity_mismatches": ("parity", "Mismatches"),
    "parity_tie_flips": ("parity", "Tie flips"),
}
# An accuracy's sample size (the metric counting its units), and the share of replies beside it that gave no answer
SAMPLE_SIZE = {"gpqa_accuracy": "gpqa_num_questions", "mc_accuracy": "mc_num_items"}
NO_ANSWER = {"gpqa_accuracy": "gpqa_no_answer"}
PROBLEM_WIDTH = 140  # characters of an error shown in a table cell
DETAILED_PASSING_CELLS = 200  # up to this many cells in a run, every cell gets its own section


def step_summary(results: RunResults, regressions: Mapping | None = None) -> str:
    """The short report: verdict, one row per cell, failed gates (with the last good and first bad run from the
    history, ``regressions``: (cell id, metric) -> (last good run id, first bad run id)), errors."""
    parts = [_heading(results), _verdict_line(results), _matrices_line(results), _environment_line(results),
             _overview(results),
             _failed_gates(results, regressions or {}), _quarantine_section(results), _errors(results),
             _rerun(results)]
    return "\n\n".join(part for part in parts if part) + "\n"


def render_markdown(results: RunResults, baseline: Baseline | None = None, comparison: str | None = None,
                    regressions: Mapping | None = None) -> str:
    """report.md: the step summary, the tables maintainers paste into SGLang pull requests, then ``render_cells``."""
    return (step_summary(results, regressions) + "\n" + pr_tables(results) + "\n"
            + render_cells(results, baseline, comparison))


def pr_tables(results: RunResults) -> str:
    """"Accuracy Tests", "Speed Tests" and "Speculative Decoding" in the form SGLang pull requests use, one row
    per measured cell, and every gate with its numbers (in a run too large to detail, the failed ones)."""
    cells = [cell for cell in results.cells if cell.metrics]
    parts = [_section("Accuracy Tests", ["Model", "Dataset", "Metric", "Subset", "Num", "Score ± SE", "Cell"],
                      [_accuracy_row(cell, _gpqa_subset(results, cell)) for cell in cells
                       if cell.metrics.get("gpqa_accuracy") is not None]
                      + [_mc_row(cell) for cell in cells if cell.metrics.get("mc_accuracy") is not None]),
             _section("Speed Tests", ["Model", "Dataset", "Num", "Avg Lat", "Avg TTFT", "Avg TPOT", "Avg Thpt",
                                      "Avg In", "Avg Out", "Cell"],
                      [_speed_row(cell) for cell in cells if any(cell.metrics.get(m) is not None for m in SPEED_LINE)]),
             _section("Speculative Decoding", ["Cell", "Algorithm", "Accept length", "Accept rate", "Speedup"],
                      [[f"`{cell.id}`", (cell.config.speculative_algorithm if cell.config else None) or "—",
                        format_value("accept_length", cell.metrics.get("accept_length")),
                        format_value("accept_rate", cell.metrics.get("accept_rate")),
                        format_value("speculative_speedup", cell.metrics.get("speculative_speedup"))]
                       for cell in cells if cell.metrics.get("accept_length") is not None]),
             _all_gates(results), _time_section(results)]
    return "\n\n".join(part for part in parts if part) + "\n"


TIME_ROWS = 20  # a long run lists its slowest cells (results.json times every one)


def _time_section(results: RunResults) -> str:
    """Where the run's time went, slowest cells first: each cell's queue, boot and measure seconds and its total."""
    timed = sorted(((c, c.timing) for c in results.cells if c.timing is not None and c.timing.seconds is not None),
                   key=lambda pair: -(pair[1].seconds or 0.0))
    if not timed:
        return ""
    rows = [[f"`{c.id}`", timing.started_at or "?", *(_secs(v) for v in (
        timing.queue_seconds, c.boot_seconds, timing.measure_seconds, timing.seconds))] for c, timing in timed]
    title = "Time" if len(rows) <= TIME_ROWS else f"Time (the {TIME_ROWS} slowest cells; results.json times every one)"
    total = sum(timing.seconds or 0.0 for _, timing in timed)
    note = f"Cell time added up: {total:.1f} s over {len(timed)} cell(s)."
    return f"{_section(title, ['Cell', 'Started', 'Queue', 'Boot', 'Measure', 'Total'], rows[:TIME_ROWS])}\n\n{note}"


def _secs(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} s"


def _section(title: str, header: list[str], rows: list[list[str]]) -> str:
    return f"## {title}\n\n{table(header, rows)}" if rows else ""


def _gpqa_subset(results: RunResults, cell: CellResult) -> str:
    """Which questions: gpqa_diamond unless the cell named another file, or the run was on the simulator
    (which answers the synthetic set, suites/data/, unless told otherwise)."""
    dataset = (cell.suites.get("gpqa") or {}).get("dataset")
    if dataset:
        return str(dataset).rstrip("/").rsplit("/", 1)[-1]
    return "synthetic (simulator)" if results.environment.get("server") in SIMULATED_SERVERS else "gpqa_diamond"


def _accuracy_row(cell: CellResult, subset: str) -> list[str]:
    metrics = cell.metrics
    return [cell.model or "?", "GPQA-Diamond", "Accuracy", subset,
            _sample_size("gpqa_accuracy", metrics), _quality_value("gpqa_accuracy", metrics), f"`{cell.id}`"]


def _mc_row(cell: CellResult) -> list[str]:
    kinds = (cell.suites.get("mc") or {}).get("categories", SUITE_DEFAULTS["mc"]["categories"]) or "all"
    return [cell.model or "?", "countries (MC, log-likelihood)", "Accuracy", kinds,
            _sample_size("mc_accuracy", cell.metrics), _quality_value("mc_accuracy", cell.metrics), f"`{cell.id}`"]


def _speed_row(cell: CellResult) -> list[str]:
    metrics = cell.metrics
    units = {"e2e_latency_s_mean": " s", "ttft_ms_mean": " ms", "tpot_ms_mean": " ms",
             "output_throughput_tok_s": " tok/s"}
    values = [format_value(m, metrics.get(m)) + (units.get(m, "") if metrics.get(m) is not None else "")
              for m in SPEED_LINE]
    requests = (cell.suites.get("speed") or {}).get("num_requests", SUITE_DEFAULTS["speed"]["num_requests"])
    return [cell.model or "?", "random", str(requests), *values, f"`{cell.id}`"]


def _all_gates(results: RunResults) -> str:
    everything = len(results.cells) <= DETAILED_PASSING_CELLS
    rows = [[f"`{cell.id}`", verdict_text(gate), describe_gate(gate)]
            for cell in results.cells for gate in cell.gates if everything or not gate.passed]
    title = "Gates" if everything else "Gates (failed only: results.json holds every gate)"
    section = _section(title, ["Cell", "Verdict", "Gate"], rows)
    levels = levels_line(results)
    return f"{section}\n\n{levels}" if section and levels else section


# A gate's verdict as the reports show it (inconclusive is neither green nor red).
VERDICT_TEXT = {"passed": "✅ pass", "regressed": "❌ regressed", "inconclusive": "❔ inconclusive"}


def verdict_text(gate) -> str:
    if gate.verdict == "regressed" and gate.statistic is None:
        return "❌ fail"
    return VERDICT_TEXT[gate.verdict]


def render_cells(results: RunResults, baseline: Baseline | None = None, comparison: str | None = None) -> str:
    """The baseline's warnings, one section per cell, then ``comparison`` (already markdown). In a run of more
    than DETAILED_PASSING_CELLS cells, passing cells keep only their overview row: a page of ten thousand
    sections is read by nobody and takes a minute to render (bench/results_scale.py)."""
    detailed = [cell for cell in results.cells
                if len(results.cells) <= DETAILED_PASSING_CELLS or cell.status.failing]
    sections = [_baseline_section(baseline), "## Cells"]
    if len(detailed) < len(results.cells):
        sections.append(f"{len(results.cells) - len(detailed)} cells that passed are listed in the overview only; "
                        "results.json holds every number.")
    sections += [_cell_section(cell, baseline, results.environment.get("sglang_version")) for cell in detailed]
    if comparison:
        sections.append(comparison.rstrip("\n"))
    return "\n\n".join(section for section in sections if section) + "\n"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_table_text(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _table_text(text: str) -> str:
    """Text safe inside one markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def status_text(status: Status) -> str:
    return f"{status.icon} {status.text}"


def _heading(results: RunResults) -> str:
    return f"# dspark-ci run `{results.run_id or '?'}`"


def _verdict_line(results: RunResults) -> str:
    cells = results.cells
    counts = ", ".join(f"{sum(c.status is s for c in cells)} {s.text}" for s in Status)
    undecided = any(cell.status is Status.INCONCLUSIVE and not cell.quarantined for cell in cells)
    verdict = ("❌ **FAILED**" if results.failed or not results.complete else "❔ **INCONCLUSIVE**" if undecided
               else "✅ **PASSED**")
    if results.interrupted:
        verdict += " (interrupted before the run finished: Ctrl-C or SIGTERM)"
    elif not results.complete:
        verdict += (" (not finished: written while the run was going; if it is not running any more, it was killed "
                    "before it finished)")
    held = sum(_held(cell) for cell in cells)
    if held:
        counts += f" ({held} of them quarantined: not gating)"
    when = _time_span(results.started_at, results.finished_at)
    return f"{verdict}: {len(cells)} cells: {counts} · launcher `{results.launcher or '?'}` · {when}"


def _time_span(started: str | None, finished: str | None) -> str:
    try:
        seconds = int((datetime.fromisoformat(finished or "") - datetime.fromisoformat(started or "")).total_seconds())
    except (TypeError, ValueError):
        return f"{started or '?'} → {finished or 'unfinished'}"
    return f"{started} → {finished} ({seconds // 60}m {seconds % 60:02d}s)"


def _matrices_line(results: RunResults) -> str:
    matrices = results.matrices
    return "Matrices: " + ", ".join(f"`{m}`" for m in matrices) if matrices else ""


# What the run recorded of where it ran (results.json "environment"): key -> label
ENVIRONMENT_LABELS = {"server": "server", "sglang_version": "SGLang", "sglang_commit": "SGLang commit",
                      "image_digests": "images", "hosts": "hosts", "hostname": "host", "gpus": "GPUs",
                      "driver": "driver", "dspark_ci_commit": "dspark-ci"}


def _environment_line(results: RunResults) -> str:
    env = results.environment
    items = [f"{name} `{_short(env[key])}`" for key, name in ENVIRONMENT_LABELS.items() if env.get(key)]
    return "Environment: " + " · ".join(items) if items else ""


def _short(value) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    text = str(value)
    return text[:12] if len(text) == 40 and all(c in "0123456789abcdef" for c in text) else text


def _overview(results: RunResults) -> str:
    header = ["Cell", "Status"] + [label(m) for m in OVERVIEW_METRICS] + ["Problem"]
    rows = [[f"`{cell.id}`", status_text(cell.status) + _label_text(cell)]
            + [format_value(m, cell.metrics.get(m)) for m in OVERVIEW_METRICS]
            + [_problem(cell)] for cell in results.cells]
    return table(header, rows)


LABEL_TEXT = {QUARANTINED: " · 🔒 quarantined (not gating)", QUARANTINE_EXPIRED: " · quarantine expired: gates again"}


def _label_text(cell: CellResult) -> str:
    return "".join(LABEL_TEXT.get(name, f" · ⚠️ {name}") for name in cell.labels)


def _problem(cell: CellResult) -> str:
    """Why a cell did not pass, in one short line ("" when it passed)."""
    text = "; ".join(_problem_lines(cell))
    return text if len(text) <= PROBLEM_WIDTH else text[:PROBLEM_WIDTH - 1] + "…"


def _held(cell: CellResult) -> bool:
    """A failing or undecided outcome that the quarantine keeps from gating."""
    return cell.quarantined and (cell.status.failing or cell.status is Status.INCONCLUSIVE)


def _problem_lines(cell: CellResult) -> list[str]:
    """Why a cell did not pass: its failed (then undecided) gates, else its error's headline; [] when it passed."""
    if cell.status in (Status.PASSED, Status.REJECTED_AS_EXPECTED):
        return []
    failed = [describe_gate(g) for g in sorted(cell.gates, key=lambda g: g.inconclusive) if not g.passed]
    headline = error_headline(cell).removeprefix(f"{cell.id}: ")
    return failed or ([headline] if headline else [])


def _failed_gates(results: RunResults, regressions: Mapping) -> str:
    """The gates that decide the run (a quarantined cell's are listed under Quarantined)."""
    gating = [cell for cell in results.cells if not cell.quarantined]
    lines = [f"- `{cell.id}`: {describe_gate(gate)}{_since(regressions.get((cell.id, gate.metric)))}"
             for cell in gating for gate in cell.gates if not gate.passed and not gate.inconclusive]
    undecided = [f"- `{cell.id}`: {describe_gate(gate)}" for cell in gating for gate in cell.gates
                 if gate.inconclusive]
    parts = ["## ❌ Failed gates\n\n" + "\n".join(lines)] if lines else []
    if undecided:
        parts.append("## ❔ Inconclusive gates (neither green nor red: no real regression beyond the tolerance shown, "
                     "the detection line not ruled out)\n\n"
                     + "\n".join(undecided))
    return "\n\n".join(parts)


def _quarantine_section(results: RunResults) -> str:
    """Every cell the quarantine file named: those it kept from gating (what they did, the ticket, the expiry) and
    those whose entry has expired, which gate again."""
    held = [f"- `{cell.id}`: {status_text(cell.status)}, {quarantine_line(cell)}"
            + "".join(f"\n  - {' '.join(line.split())}" for line in _problem_lines(cell))
            for cell in results.cells if cell.quarantined]
    expired = [f"- `{cell.id}`: {status_text(cell.status)}. {quarantine_line(cell)}"
               for cell in results.cells if cell.quarantine_expired]
    parts = ["## 🔒 Quarantined (ran and reported, not gating)\n\n" + "\n".join(held)] if held else []
    if expired:
        parts.append("## ⏰ Quarantine expired (these cells gate again)\n\n" + "\n".join(expired))
    return "\n\n".join(parts)


def _since(regression: tuple | None) -> str:
    """" (last good run `A`, first bad run `B`)" from the run history, when it knows."""
    if not regression or not regression[1]:
        return ""
    good, bad = regression
    return (f" (last good run `{good}`, first bad run `{bad}`)" if good
            else f" (failing in every recorded run since `{bad}`)")


def _errors(results: RunResults) -> str:
    blocks = [f"### `{cell.id}` ({cell.status.value}{', quarantined: not gating' if cell.quarantined else ''})"
              f"\n\n{_code_block(cell.error)}"
              for cell in results.cells if cell.status.failing and cell.error]
    return "## 💥 Errors\n\n" + "\n\n".join(blocks) if blocks else ""


def rerun_command(results: RunResults) -> str | None:
    """One command that runs again exactly the cells that failed or erred, or None when none did."""
    failing = [cell.id for cell in results.cells if cell.status.failing]
    if not failing:
        return None
    words = ["dspark-ci", "run", *(results.matrices or ["MATRIX"]), *results.run_options]
    if results.launcher and results.launcher != "local" and "--launcher" not in results.run_options:
        words += ["--launcher", results.launcher]
    for cell_id in failing:
        words += ["--cell", cell_id]
    return " ".join(shlex.quote(word) for word in words)


def _rerun(results: RunResults) -> str:
    command = rerun_command(results)
    return f"Run the cells that did not pass again:\n\n{_code_block(command)}" if command else ""


def _code_block(text: str) -> str:
    fence = "~~~~" if "```" in text else "```"
    return f"{fence}\n{text.rstrip()}\n{fence}"


def _baseline_section(baseline: Baseline | None) -> str:
    if baseline is None:
        return ""
    paragraphs = [f"## Baseline `{baseline.path}`"]
    if baseline.description:
        paragraphs.append(baseline.description)
    if baseline.source:
        paragraphs.append(f"Source: {baseline.source}")
    if baseline.warnings:
        paragraphs.append("\n".join(f"- ⚠️ {warning}" for warning in baseline.warnings))
    return "\n\n".join(paragraphs)


def _cell_section(cell: CellResult, baseline: Baseline | None, version: str | None = None) -> str:
    metrics = cell.metrics
    parts = [f"### {cell.status.icon} `{cell.id}`: {cell.status.text}", _config_line(cell)]
    said = rejection_message(cell)
    if said:
        parts.append(f"Rejected as expected: `{' '.join(said.split())}`")
    if cell.decided_by == DECIDED_BY_RESOLVER:
        parts.append(f"Decided by {resolver_name(version)}, not launched.")
    parts += [_quality_table(cell, metrics), acceptance_section(cell), envelope_section(cell), _speed_tables(metrics),
              _gates_table(cell, metrics, baseline)]
    parts.append("\n".join(f"- ⚠️ {' '.join(str(w).split())}" for w in (*_quarantine_note(cell), *cell.warnings)))
    if (cell.status.failing or cell.status is Status.SKIPPED) and cell.error:
        parts.append(_code_block(cell.error))
    return "\n\n".join(part for part in parts if part)


def _quarantine_note(cell: CellResult) -> tuple[str, ...]:
    line = quarantine_line(cell)
    return (line,) if line else ()


def _config_line(cell: CellResult) -> str:
    items = [f"`{cell.model}`"] if cell.model else []
    items += summary_items(cell.config or {})  # each setting as its row says (ground/sglang/settings.py)
    time_spent = time_line(cell)
    if time_spent:
        items.append(time_spent)
    return " · ".join(items)


def resolver_name(version: str | None) -> str:
    return f"SGLang {version}'s resolver" if version else "SGLang's resolver"


def time_line(cell: CellResult) -> str:
    """Where the cell's time went: ``42.1 s (queue 3.0 s, boot 20.5 s, measure 18.6 s)``, as far as known."""
    timing = cell.timing
    parts = [f"{name} {value:.1f} s" for name, value in (
        ("queue", timing.queue_seconds if timing else None), ("boot", cell.boot_seconds),
        ("measure", timing.measure_seconds if timing else None)) if value is not None]
    if timing is None or timing.seconds is None:
        return ", ".join(parts)
    return f"{timing.seconds:.1f} s" + (f" ({', '.join(parts)})" if parts else "")


def _quality_table(cell: CellResult, metrics: Mapping) -> str:
    model = cell.model or "?"
    rows = [[model, dataset, _scored_by(cell, metric, name), _sample_size(metric, metrics),
             _quality_value(metric, metrics)]
            for metric, (dataset, name) in QUALITY_ROWS.items() if metrics.get(metric) is not None]
    if cell.mc is not None and metrics.get("mc_accuracy") is not None:  # each kind of item: shown, gated as the whole
        rows += [[model, f"MC (log-likelihood): {kind}", "Accuracy", str(asked),
                  format_value("mc_accuracy", right / asked)]
                 for kind, (right, asked) in cell.mc.per_category.items() if asked]
    note = cell.gpqa
    if note is not None and note.partial and note.accuracy is not None:  # never a metric: shown, not gated
        rows.insert(0, [model, "GPQA", f"{_scored_by(cell, 'gpqa_accuracy', 'Accuracy')}, PARTIAL",
                        f"{note.samples} of {note.planned_samples} samples",
                        f"{format_value('gpqa_accuracy', note.accuracy)} (partial: not gated)"])
    return table(["Model", "Dataset", "Metric", "n", "value"], rows) if rows else ""


def _scored_by(cell: CellResult, metric: str, name: str) -> str:
    """The metric's label, naming the GPQA scorer that produced the figure when the run recorded one."""
    if metric == "gpqa_accuracy" and cell.gpqa and cell.gpqa.scorer:
        differs = cell.gpqa.cli_differences
        unlike = f"; sent unlike its CLI: {', '.join(differs)}" if differs else ""
        return f"{name} (scorer {cell.gpqa.scorer}{unlike})"
    return name


def _sample_size(metric: str, metrics: Mapping) -> str:
    count = SAMPLE_SIZE.get(metric)
    if count is None or metrics.get(count) is None:
        return ""
    repeats = metrics.get("gpqa_repeats") or 1 if metric == "gpqa_accuracy" else 1
    questions = f"{metrics[count]:.0f}"
    return questions if repeats == 1 else f"{questions} × {repeats:.0f}"


def _quality_value(metric: str, metrics: Mapping) -> str:
    value = format_value(metric, metrics[metric])
    stderr = STDERR_OF.get(metric)  # its standard error's metric (dspark_ci.reports.metrics), when it has one
    if stderr and metrics.get(stderr) is not None:
        value += f" ± {format_value(stderr, metrics[stderr])}"
    unanswered = NO_ANSWER.get(metric)
    if unanswered and metrics.get(unanswered) is not None:  # free-text extraction: how often it found no answer
        value += f" (no answer in {format_value(unanswered, metrics[unanswered])})"
    return value


def _speed_tables(metrics: Mapping) -> str:
    tables = [table([label(m) for m in columns], [[format_value(m, metrics.get(m)) for m in columns]])
              for columns in (SPEED_LINE, *SPEED_DETAIL) if any(metrics.get(m) is not None for m in columns)]
    return "\n\n".join(text for text in (*tables, _ttft_split_table(metrics)) if text)


def _ttft_split_table(metrics: Mapping) -> str:
    """A disaggregated cell's mean TTFT and the parts its servers reported; a part they did not is said so."""
    ttft, *parts = TTFT_SPLIT
    if not any(metrics.get(m) is not None for m in parts):
        return ""
    cells = [format_value(m, metrics[m]) if metrics.get(m) is not None else "not reported by the server"
             for m in parts]
    return table([label(m) for m in TTFT_SPLIT], [[format_value(ttft, metrics.get(ttft)), *cells]])


def _gates_table(cell: CellResult, metrics: Mapping, baseline: Baseline | None) -> str:
    if not cell.gates:
        return ""
    bases = explain(cell, metrics, baseline)
    rows = [[f"{g.metric} {g.op} {format_value(g.metric, g.threshold)}",
             "not measured" if g.value is None else format_value(g.metric, g.value),
             bases.get((g.metric, g.op, g.threshold), ""), verdict_text(g),
             g.statistic.describe() if g.statistic else ""]
            for g in cell.gates]
    return table(["Gate", "Value", "Threshold from", "Result", "Effect [interval] vs tolerance (test)"], rows)

