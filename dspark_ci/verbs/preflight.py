"""``dspark-ci preflight``: SGLang's own argument resolution on every rank of every cell, against its expectation."""

from __future__ import annotations

import argparse
import re

from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.sglang.resolver import Resolution, Resolver, locate
from dspark_ci.matrices import load_cells
from dspark_ci.matrices.shipped import matrix_path
from dspark_ci.pipeline import select_cells
from dspark_ci.rejections import CellVerdict, judge

EPILOG = """\
--sglang:
  local    the first Python with sglang importable: $DSPARK_SGLANG_PYTHON, .cache/sglang-venv/bin/python
           (made by `bash .ci/sglang-resolver.sh`), then this Python
  PATH     that Python interpreter
  IMAGE    a Docker image: `docker run --rm -i --network none IMAGE python3 ...` (no GPU)
  Given twice (--sglang A --sglang B), lists the cells whose verdict or message differs between A and B.

Models resolve against config-only stubs (ground/sglang/model_configs/) or, when --model-path is a local
directory, that checkpoint's own config.json. What only the hardware can decide (megamoe's SM90/SM100 check,
torch_npu, device memory) is listed as "needs the hardware", never counted as agreement.

exit codes: 0 every judged cell agrees; 1 a disagreement (cell and both sides named); 2 bad input;
3 SGLang cannot be found or run (the message says how to install it)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("matrices", nargs="+", metavar="MATRIX", type=matrix_path,
                        help="matrix YAML files, or a shipped matrix's name")
    parser.add_argument("--sglang", action="append", metavar="local|PYTHON|IMAGE",
                        help="where SGLang's resolver runs (default: local); twice for drift between two")
    parser.add_argument("--cell", action="append", metavar="ID", help="only this cell (repeatable)")


def disagreement(verdict: CellVerdict) -> str | None:
    """Why SGLang and the cell's expectation differ, naming both sides; None when they agree."""
    expect = verdict.cell.expect
    rank, result = verdict.deciding
    if not expect.rejects and result.verdict == "rejected":
        return f"expected serve; SGLang rejects: rank {rank}: {result.line}"
    if expect.rejects and result.verdict == "admitted":
        return f"expected reject /{expect.message}/; SGLang admits every rank"
    if expect.rejects and result.verdict == "rejected" and expect.message \
            and not re.search(expect.message, result.line):
        return f"expected reject /{expect.message}/; SGLang rejects with: rank {rank}: {result.line}"
    return None


def _values(result: Resolution) -> str:
    r = result.resolved
    algorithm = r.get("speculative_algorithm")
    tokens = r.get("speculative_num_draft_tokens")
    block = "-"
    if tokens is not None and algorithm == "DSPARK":
        block = f"gamma={tokens - 1}"
    elif tokens is not None and algorithm == "DFLASH":
        block = str(tokens)
    tp, attn_dp, attn_cp = r.get("tp_size") or 1, r.get("attn_dp_size") or 1, r.get("attn_cp_size") or 1
    return (f"{algorithm or 'no-spec'} draft_tokens={tokens if tokens is not None else '-'} block={block} "
            f"attn_tp={tp // (attn_dp * attn_cp) if tp % (attn_dp * attn_cp) == 0 else '?'} attn_dp={attn_dp} "
            f"attn_cp={attn_cp} dp_lm_head={'on' if r.get('enable_dp_lm_head') else 'off'} "
            f"a2a={r.get('moe_a2a_backend')} chunked_prefill={r.get('chunked_prefill_size')}")


def _header(resolver: Resolver) -> str:
    stubs = ", ".join(resolver.stubs) or "none"
    where = resolver.python or resolver.label
    return f"SGLang {resolver.version} ({resolver.label}: {where}; stubbed modules: {stubs})"


def report(resolver: Resolver, verdicts: list[CellVerdict]) -> int:
    print(_header(resolver))
    agree, disagree, hardware = [], [], []  # type: list[CellVerdict], list[CellVerdict], list[CellVerdict]
    for verdict in verdicts:
        _, result = verdict.deciding
        if result.verdict == "hardware":
            hardware.append(verdict)
            continue
        problem = disagreement(verdict)
        (disagree if problem else agree).append(verdict)
        mark = "DISAGREE" if problem else "agree"
        print(f"{mark:<9}{verdict.cell.id}: {problem or verdict.cell.expect.outcome + ', SGLang: ' + verdict.summary}")
        for rank, rank_result in enumerate(verdict.ranks):
            detail = _values(rank_result) if rank_result.verdict == "admitted" else rank_result.line
            print(f"           rank {rank}: {rank_result.verdict}: {detail}")
    if hardware:
        print("needs the hardware (not judged on a CPU):")
        for verdict in hardware:
            print(f"  {verdict.cell.id}: expected {verdict.cell.expect.outcome}; {verdict.summary}")
    print(f"{len(verdicts)} cells: {len(agree)} agree, {len(disagree)} disagree, {len(hardware)} need the hardware")
    for verdict in disagree:
        print(f"disagreement: {verdict.cell.id} ({verdict.cell.matrix}): {disagreement(verdict)}")
    return 1 if disagree else 0


def drift(first: tuple[Resolver, list[CellVerdict]], second: tuple[Resolver, list[CellVerdict]]) -> int:
    (a, left), (b, right) = first, second
    print(f"A: {_header(a)}\nB: {_header(b)}")
    changed = [(x, y) for x, y in zip(left, right, strict=False) if x.summary != y.summary]
    for x, y in changed:
        print(f"{x.cell.id}:\n  A: {x.summary}\n  B: {y.summary}")
    print(f"{len(changed)} of {len(left)} cells changed verdict or message between A and B")
    return 0


def run(args: argparse.Namespace) -> int:
    specs = args.sglang or ["local"]
    if len(specs) > 2:
        raise BadInput("--sglang", f"given {len(specs)} times", "give one, or two to compare them")
    cells = select_cells(load_cells(args.matrices), tuple(args.cell or ()))
    judged = [judge(cells, locate(spec)) for spec in specs]
    if len(judged) == 2:
        return drift(judged[0], judged[1])
    return report(*judged[0])
