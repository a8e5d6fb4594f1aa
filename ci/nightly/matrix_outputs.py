"""``python -m dspark_ci.ci.nightly.matrix_outputs PLAN_JSON``: `dspark-ci plan --format github` output -> \
$GITHUB_OUTPUT lines.

GitHub runs at most 256 jobs per matrix, so past 256 cells the plan splits into chunks
(``{"chunks": [{"include": [...]}, ...]}``) and the nightly workflow has one run job per chunk.
This prints one output per run job, always all of them, so every job's ``fromJSON`` has valid
JSON to read (unused chunks are empty and their jobs are skipped):

    cells=300
    chunks=2
    matrix={"include":[...256 entries...]}
    matrix_2={"include":[...44 entries...]}
    matrix_3={"include":[]}
    ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dspark_ci.ci.tool import run_tool
from dspark_ci.ground.errors import BadInput

MAX_CHUNKS = 4  # run jobs in nightly.yml: 4 x 256 = 1024 cells


def chunk_output_name(index: int) -> str:
    """Output (and job) name of chunk ``index`` (0-based): matrix, matrix_2, matrix_3, ..."""
    return "matrix" if index == 0 else f"matrix_{index + 1}"


def github_outputs(plan: dict, source: str, max_chunks: int = MAX_CHUNKS) -> list[str]:
    chunks = plan.get("chunks") if isinstance(plan, dict) and "chunks" in plan else [plan]
    if not isinstance(chunks, list) or not all(isinstance(c, dict) and isinstance(c.get("include"), list)
                                               for c in chunks):
        raise BadInput(source, 'expected {"include": [...]} or {"chunks": [{"include": [...]}, ...]}',
                       "pass the output of `dspark-ci plan MATRIX --format github`")
    if len(chunks) > max_chunks:
        raise BadInput(source, f"{len(chunks)} chunks of cells, but the workflow has only {max_chunks} run jobs",
                       "raise MAX_CHUNKS in ci/nightly/matrix_outputs.py and run `python -m dspark_ci.ci.workflows`")
    cells = sum(len(chunk["include"]) for chunk in chunks)
    padded = chunks + [{"include": []}] * (max_chunks - len(chunks))
    lines = [f"cells={cells}", f"chunks={len(chunks)}"]
    lines += [f"{chunk_output_name(i)}={json.dumps(chunk, separators=(',', ':'))}" for i, chunk in enumerate(padded)]
    return lines


def read_plan(path: Path) -> list[dict]:
    """The entries of a `dspark-ci plan --format github` output (one object, or chunks), in order."""
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
        chunks = plan["chunks"] if "chunks" in plan else [plan]
        entries = [entry for chunk in chunks for entry in chunk["include"]]
        if not all(isinstance(e, dict) and isinstance(e.get("cell"), str) and isinstance(e.get("runner"), str)
                   for e in entries):
            raise TypeError("an entry has no cell or runner")
        return entries
    except OSError as err:
        raise BadInput(str(path), f"cannot read it ({err.strerror})") from None
    except (ValueError, KeyError, TypeError) as err:
        raise BadInput(str(path), f"not a `dspark-ci plan --format github` output ({err})",
                       "pass the plan job's matrix JSON") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dspark_ci.ci.nightly.matrix_outputs",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("plan_json", help="file with `dspark-ci plan --format github` output ('-': stdin)")
    args = parser.parse_args(argv)

    def body() -> int:
        source = "stdin" if args.plan_json == "-" else args.plan_json
        try:
            text = sys.stdin.read() if args.plan_json == "-" else Path(args.plan_json).read_text()
            plan = json.loads(text)
        except OSError as err:
            raise BadInput(source, f"cannot read it ({err.strerror})") from None
        except json.JSONDecodeError as err:
            raise BadInput(f"{source}:{err.lineno}", f"not valid JSON ({err.msg})",
                           "pass the output of `dspark-ci plan MATRIX --format github`") from None
        print("\n".join(github_outputs(plan, source)))
        return 0

    return run_tool("dspark_ci.ci.nightly.matrix_outputs", body)


if __name__ == "__main__":
    sys.exit(main())
