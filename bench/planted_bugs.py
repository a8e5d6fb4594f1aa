"""Bugs planted in SGLang's own code, run on SGLang's real CPU engine: does the suite catch each, for the right reason?

    python bench/planted_bugs.py [--smoke] [--bug NAME ...] [--matrix matrices/cpu-engine.yaml] [--keep DIR]

Each bug of ``BUGS`` is modelled on a real SGLang bug. It is planted in a shadow copy of the SGLang package of the
engine's venv (``DSPARK_SGLANG_ENGINE_PYTHON``; the venv itself is never written): one file patched by an exact text
replacement that must match once, or the bug is reported "n/a" (this SGLang no longer has that code). The shadow's
parent directory goes on PYTHONPATH, which ``dspark_ci.sglang_sim.cpu_engine.engine_env`` keeps after the CPU kernels'
boot directory, ahead of site-packages; the shadow's ``__init__`` writes a marker line to stderr, so every SGLang
process that imported it says so in its rank log, and the bench counts those lines (a bug whose run shows none was not
run). Then ``dspark-ci run MATRIX --server sglang-engine --cell ...`` runs the cells the bug concerns, as a user runs
them, and results.json says what caught it:

- caught: a cell is not green, and a failed gate, test, error or SGLang line matches one of the bug's right reasons;
- caught (wrong reason): a cell is not green, but for none of the bug's right reasons (what did catch it is shown);
- missed: every cell green (or rejected as expected).

The unplanted control runs the same way first and must be green. ``--smoke`` (CI): two bugs that fail fast, the
control on the expected rejection only (``SMOKE``). Exits 1 when the control is not green or a bug is missed; one
engine run at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# cells of matrices/cpu-engine.yaml (SmolLM2-135M-Instruct)
NGRAM = "smollm2-135m-tp1-a2a-none-ngram-cpu"
PLAIN = "smollm2-135m-tp1-a2a-none-cpu"
TP2 = "smollm2-135m-tp2-a2a-none-cpu"
CTX = "smollm2-135m-tp1-a2a-none-cpu-ctx16384"
MARKER = "dspark-ci planted-bug shadow of sglang imported from"
SHADOW_MARK = (f'\nimport sys as _dspark_sys\n_dspark_sys.stderr.write("{MARKER} " + __file__ + "\\n")\n'
               "del _dspark_sys\n")


@dataclass(frozen=True)
class Bug:
    name: str
    modelled_on: str  # the real SGLang bug it reproduces
    file: str  # inside the sglang package
    old: str  # exact text, found once
    new: str
    cells: tuple[str, ...]
    right_reasons: tuple[str, ...]  # regexes over the evidence lines ("gate M", "test ID: message", errors)
    expected: str  # what should catch it, and why that is the right reason
    not_on_cpu: str = ""  # why the bug cannot be planted on a CPU (then "n/a", never run): SGLang already differs


_NGRAM_COPY = "        draft_tokens.copy_(torch.from_numpy(req_drafts), non_blocking=True)\n"
_NGRAM_ROWS = "        drafts = req_drafts.reshape(bs, self.draft_token_num).copy()\n"
# Every draft token moved to a neighbour id (never itself, always in the vocabulary); the root (the last verified
# token) kept: verification then rejects the drafts and the output stays exact.
_SHIFTED = "np.where(drafts[{rows}, 1:] > 0, drafts[{rows}, 1:] - 1, drafts[{rows}, 1:] + 1)"


def _corrupt(rows: str, choose: str = "") -> str:
    return (_NGRAM_ROWS + choose + f"        drafts[{rows}, 1:] = {_SHIFTED.format(rows=rows)}\n"
            "        draft_tokens.copy_(torch.from_numpy(drafts.reshape(-1)), non_blocking=True)\n")


BUGS: tuple[Bug, ...] = (
    Bug("drafts-corrupted-lossless", "the seed of this project: a draft path that proposes garbage while the target "
        "keeps the output exact; a healthy-looking server accepting ~0 drafts",
        "srt/speculative/ngram_worker.py", _NGRAM_COPY, _corrupt(":"), (NGRAM,),
        (r"sanity.*drafts_are_accepted", r"collapse floor", r"gate accept_length"),
        "the collapse floor (accept length >= 1.1 on NGRAM's sanity check) and the accept_length baseline gate"),
    Bug("draft-degraded-30pct", "a draft that loses quality (a stale draft checkpoint or wrong draft layer) so "
        "acceptance drops by about a third while nothing fails",
        "srt/speculative/ngram_worker.py", _NGRAM_COPY,
        # Rows corrupted against the drop they cost (2026-12-07, one run each): 30 % cost 13 % (1.334 -> 1.295;
        # many verify steps accept nothing either way), 70 % fell under the collapse floor, 50 % cost 29 %
        # (1.334 -> 1.237), the third the bug is named for
        _corrupt("rows", "        rows = np.random.default_rng().random(bs) < 0.5\n"), (NGRAM,),
        (r"gate accept_length", r"gate accept_rate"),
        "the accept_length gate of baselines/cpu-engine.yaml, paired over the NGRAM cell's 16 requests"),
    Bug("assert-first-prefill-spec", "an assertion that fires on the first prefill batch under speculation (the "
        "speculative worker's extend path asserting a state only decode has)",
        "srt/speculative/ngram_worker.py",
        "        else:\n            batch_result = self.target_worker.forward_batch_generation(\n",
        "        else:\n            assert batch.forward_mode.is_decode(), "
        "f\"{batch.forward_mode=} under speculation\"\n"
        "            batch_result = self.target_worker.forward_batch_generation(\n", (NGRAM,),
        (r"AssertionError",), "the cell errors at once, SGLang's AssertionError line named"),
    Bug("context-length-message-reworded", "SGLang rewording the context-length admission message that deployments "
        "and this matrix's expected rejection match",
        "srt/configs/model_config.py",
        "context_length ({context_length}) is greater than the derived context_length ({derived_context_len})",
        "context_length ({context_length}) exceeds the model's derived context_length ({derived_context_len})",
        (CTX,), (r"expect|expected|message",), "the expected rejection's message no longer matches"),
    # The SGLang release we pin builds o_proj with reduce_results=False already: the layer's stage boundary
    # all-reduces after attention (models/llama.py LlamaDecoderLayer), so planting reduce_results=False there changed
    # nothing (a run read the same tokens and MC as unplanted). The partial of tensor-parallel rank 1 is dropped
    # before that sum.
    Bug("tp2-o-proj-allreduce-skipped", "attention's output summed over one tensor-parallel rank's partial only (an "
        "all-reduce that skips a shard), so tp 2 serves plausible text, different from tp 1's",
        "srt/models/llama.py",
        "        attn_output = self.attn(q, k, v, forward_batch)\n        output, _ = self.o_proj(attn_output)\n",
        "        attn_output = self.attn(q, k, v, forward_batch)\n        output, _ = self.o_proj(attn_output)\n"
        "        from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_rank\n"
        "        if get_tensor_model_parallel_rank() == 1:\n            output = torch.zeros_like(output)\n",
        (TP2,), (r"parity", r"gate mc_accuracy"), "cross-layout parity (tp 2 against one rank) and MC accuracy"),
    Bug("accept-counters-doubled", "the scheduler's cumulative accept counter incremented twice, so /server_info's "
        "avg_spec_accept_length is twice the truth (4.31 with 4 draft tokens)",
        "srt/managers/scheduler_components/metrics_reporter.py",
        "            self.spec_total_num_accept_tokens += self.spec_num_accept_tokens\n",
        "            self.spec_total_num_accept_tokens += 2 * self.spec_num_accept_tokens\n", (NGRAM,),
        (r"exceeds speculative_num_draft_tokens", r"disagrees with /server_info"),
        "the draft bound and the cross-check of /server_info against the per-request figures"),
    Bug("sleep-20ms-per-decode-step", "a per-step host sync or debug sleep on the decode path: every output token "
        "slower by 20 ms, the output unchanged",
        "srt/model_executor/model_runner.py",
        "            if (\n                forward_batch.forward_mode.is_decode()\n"
        "                and self.hisparse_coordinator is not None\n",
        "            if forward_batch.forward_mode.is_decode():\n                time.sleep(0.02)\n"
        "            if (\n                forward_batch.forward_mode.is_decode()\n"
        "                and self.hisparse_coordinator is not None\n",
        (PLAIN,), (r"gate scheduler_blocked_ms_per_token",),
        "the scheduler's blocked time per token (suites/offcpu.py) over its recorded ceiling: absolute speed on a "
        "shared CPU is noise, time the scheduler spends runnable-nothing is not"),
    Bug("spec-sampling-lossy", "speculative verification committing the argmax under temperature > 0 (greedy "
        "verify where rejection sampling belongs): sampled output no longer follows the target's distribution",
        "srt/speculative/eagle_utils.py",
        "    return is_all_greedy or is_cpu or is_xpu or (is_hip and not use_rejection_sampling)\n",
        "    return True\n", (NGRAM,), (r"sampled_lossless",),
        "the per-position test of sampled losslessness (gate sampled_lossless_p)",
        "Pinned SGLang already verifies greedily on a CPU at any temperature (_verify_uses_greedy `or is_cpu`), so "
        "the unplanted engine has this behaviour: the accept suite measured it (every tested position red, family p "
        "5e-15) and matrices/cpu-engine.yaml measures no sampled losslessness. Caught on the simulator "
        "(fault greedy_verify: BENCHMARKS.md, sampled losslessness)"),
)
# The smallest run through every stage (shadow, marker lines, a real engine run, judging): two bugs that fail fast, an
# admission message reworded (the ctx16384 cell, seconds) and an assertion on the first prefill (one boot), and the
# control on the expected rejection only. In CI the engine-matrix phase is the speculative cells' unplanted control.
SMOKE = ("context-length-message-reworded", "assert-first-prefill-spec")
SMOKE_CONTROL = (CTX,)


@dataclass(frozen=True)
class Outcome:
    bug: str
    verdict: str  # control: green | red; bug: caught | caught (wrong reason) | missed | n/a | not run
    why: str  # the evidence line that decided it
    statuses: str
    shadow_imports: int  # marker lines in the rank logs: SGLang processes that imported the shadow
    seconds: float


def plant(bug: Bug | None, site: Path, work: Path) -> Path | str:
    """A shadow of ``site``/sglang under ``work`` with ``bug`` planted; a string says why it cannot be."""
    shadow = work / "shadow"
    shutil.copytree(site / "sglang", shadow / "sglang", symlinks=True)
    init = shadow / "sglang" / "__init__.py"
    init.write_text(init.read_text() + SHADOW_MARK)
    if bug is None:
        return shadow
    target = shadow / "sglang" / bug.file
    text = target.read_text()
    if text.count(bug.old) != 1:
        return f"{bug.file}: the planted text matches {text.count(bug.old)} times (this SGLang differs)"
    target.write_text(text.replace(bug.old, bug.new))
    return shadow


def run(cells: tuple[str, ...], shadow: Path, work: Path, matrix: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(shadow), os.environ.get("PYTHONPATH")))),
           "DSPARK_STATE_DIR": str(work / "state"), "DSPARK_HISTORY": str(work / "state" / "history.sqlite"),
           "CI": "true"}
    selection = [arg for cell in cells for arg in ("--cell", cell)]
    out = work / "run"
    subprocess.run([sys.executable, "-m", "dspark_ci", "run", matrix, "--server", "sglang-engine", *selection,
                    "--out", str(out), "--quiet"], env=env, cwd=REPO, capture_output=True, text=True)
    results = out / "results.json"
    return json.loads(results.read_text()) if results.exists() else {"cells": []}


def evidence(cell: dict) -> list[str]:
    """What a cell failed on, one line each, the cell's own error first (a gate left unmeasured by a failed sanity
    check is a consequence, not the cause): its error, SGLang's own line, failed tests, failed gates."""
    lines = [f"{key}: {cell[key]}" for key in ("error", "sglang_error") if cell.get(key)]
    lines += [f"test {t['nodeid']}: {t.get('message') or ''}" for t in cell.get("tests") or []
              if t.get("outcome") in ("failed", "error")]
    return lines + [f"gate {g['metric']} {g.get('value')} {g['op']} {g['threshold']}" for g in cell.get("gates") or []
                    if not g.get("passed")]


def judge(bug: Bug | None, results: dict) -> tuple[str, str]:
    cells = results["cells"]
    red = [c for c in cells if c["status"] not in ("passed", "rejected_as_expected")]
    lines = [line for c in red for line in evidence(c)]
    if bug is None:
        return ("green", "") if cells and not red else ("red", (lines or ["no cell ran"])[0])
    if not cells:
        return "not run", "no results.json"
    if not red:
        return "missed", "every cell green"
    right = [line for line in lines if any(re.search(reason, line, re.I) for reason in bug.right_reasons)]
    return ("caught", right[0]) if right else ("caught (wrong reason)", (lines or ["red, no evidence"])[0])


def shadow_imports(work: Path) -> int:
    return sum(log.read_text(errors="replace").count(MARKER) for log in (work / "run" / "logs").rglob("*.log"))


def one(bug: Bug | None, cells: tuple[str, ...], site: Path, matrix: str, keep: Path | None) -> Outcome:
    if bug is not None and bug.not_on_cpu:
        return Outcome(bug.name, "n/a", f"not on a CPU: {bug.not_on_cpu}", "", 0, 0.0)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="planted-", dir=keep))
    try:
        shadow = plant(bug, site, work)
        if isinstance(shadow, str):
            return Outcome(bug.name if bug else "control", "n/a", shadow, "", 0, 0.0)
        results = run(cells, shadow, work, matrix)
        verdict, why = judge(bug, results)
        statuses = ", ".join(f"{c['id']}={c['status']}" for c in results["cells"])
        return Outcome(bug.name if bug else "control", verdict, why, statuses, shadow_imports(work),
                       time.monotonic() - started)
    finally:
        shutil.rmtree(work / "shadow", ignore_errors=True)  # 220 MB each; the run's logs stay with --keep
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)


def site_packages() -> Path:
    default = REPO / ".cache" / "sglang-venv" / "bin" / "python"  # where .ci/sglang-engine.sh installs it
    python = os.environ.get("DSPARK_SGLANG_ENGINE_PYTHON") or (str(default) if default.exists() else sys.exit(
        "bench/planted_bugs.py: set DSPARK_SGLANG_ENGINE_PYTHON to the engine venv's python (.ci/sglang-engine.sh)"))
    found = subprocess.run([python, "-c",
                            "import sglang, os; print(os.path.dirname(os.path.dirname(sglang.__file__)))"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    return Path(found.stdout.strip()) if found.returncode == 0 else sys.exit(f"no sglang in {python}: {found.stderr}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help=f"{', '.join(SMOKE)}, the control on {CTX} only")
    parser.add_argument("--bug", action="append", choices=[b.name for b in BUGS], help="only these (repeatable)")
    parser.add_argument("--matrix", default="matrices/cpu-engine.yaml")
    parser.add_argument("--keep", type=Path, help="keep each run's directory (results, logs) under this one")
    parser.add_argument("--no-control", action="store_true", help="skip the unplanted control")
    args = parser.parse_args()
    chosen = [b for b in BUGS if b.name in (SMOKE if args.smoke else args.bug or [b.name for b in BUGS])]
    site, began = site_packages(), time.monotonic()
    control_cells = SMOKE_CONTROL if args.smoke else tuple(dict.fromkeys(c for b in chosen for c in b.cells))
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    outcomes = [] if args.no_control else [one(None, control_cells, site, args.matrix, args.keep)]
    print(*map(row, outcomes), sep="\n", flush=True)
    for bug in chosen:
        outcomes.append(one(bug, bug.cells, site, args.matrix, args.keep))
        print(row(outcomes[-1]), flush=True)
    print(table(outcomes, chosen), f"\ncatalogue wall time {time.monotonic() - began:.0f} s", sep="\n")
    control_green = all(o.verdict == "green" for o in outcomes if o.bug == "control")
    failing = ("missed", "not run", "caught (wrong reason)")
    return 0 if control_green and not any(o.verdict in failing for o in outcomes) else 1


def row(o: Outcome) -> str:
    return (f"{o.bug:32} {o.verdict:22} {o.seconds:5.0f}s  shadow imports {o.shadow_imports:3}  {o.why[:150]}\n"
            f"{'':32} {o.statuses}")


def table(outcomes: list[Outcome], bugs: list[Bug]) -> str:
    expected = {b.name: b.expected for b in bugs}
    lines = [f"{'bug':32} {'verdict':22} {'time':>6}  shadow  caught by / why", "-" * 120]
    for o in outcomes:
        lines += [row(o)] + ([f"{'':32} expected: {expected[o.bug]}"] if o.bug in expected else [])
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
