"""``dspark-ci plan``: expand matrices into validated cells and print them; nothing is launched."""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from collections.abc import Callable

from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.records import DECIDED_BY_RESOLVER
from dspark_ci.ground.sglang.release import DEFAULT_VERSION
from dspark_ci.launchers.k8s import spec as k8s_spec
from dspark_ci.launchers.launch_plan import plan_launch
from dspark_ci.launchers.pd.k8s import pd_manifests
from dspark_ci.launchers.pd.pd_plan import PDPlan, plan_pd
from dspark_ci.launchers.plan_types import LaunchPlan, Placement
from dspark_ci.matrices import Cell, load_cells
from dspark_ci.matrices.shipped import matrix_path
from dspark_ci.rejections import decide_rejections
from dspark_ci.tables import text_table

GITHUB_MAX_JOBS = 256  # GitHub Actions runs at most 256 jobs per matrix

EPILOG = f"""\
formats:
  table   aligned columns for people (default)
  json    {{"cells": [CELL, ...]}}: each cell as in CONTRACT.md, with "ranks" (per-node argv and env
          for SGLang {DEFAULT_VERSION}, placed on a template: bind 0.0.0.0, leader ${{NODE0_ADDR}})
  github  {{"include": [{{"cell": ID, "runner": LABEL, "matrix": PATH, "expect": OUTCOME,
          "nnodes": N[, "decided_by": "resolver"]}}, ...]}} for
          `strategy.matrix: ${{{{ fromJSON(needs.plan.outputs.matrix) }}}}`, on one line.
          Past {GITHUB_MAX_JOBS} cells (GitHub's per-matrix job limit) the output becomes
          {{"chunks": [{{"include": [...]}}, ...]}} with at most {GITHUB_MAX_JOBS} entries per chunk, in cell
          order; give each chunk its own job: `fromJSON(needs.plan.outputs.matrix).chunks[0]`, ...
          The split is reported on stderr.
  k8s     per cell a LeaderWorkerSet and a Service for rank 0 (multi-document YAML for `kubectl apply -f -`;
          docs/K8S.md); `--k8s-extra FILE` merges a site patch into each (node selectors, tolerations, ...)

exit codes: 0 printed; 2 bad matrix or arguments (the message names file:line and the fix)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("matrices", nargs="+", metavar="MATRIX", type=matrix_path,
                        help="matrix YAML files (e.g. matrices/nightly.yaml), or a shipped matrix's name (nightly)")
    parser.add_argument("--format", choices=("table", "json", "github", "k8s"), default="table",
                        help="output format (default: table)")
    parser.add_argument("--select", action="append", metavar="PATTERN",
                        help="keep cells whose id matches this glob (e.g. '*-npu'); repeatable")
    parser.add_argument("--rejections", choices=("launch", "resolver"), default="launch",
                        help="with --format github: mark the expected rejections SGLang's own resolver decides "
                        "on a CPU "
                        "(\"decided_by\": \"resolver\"), which the nightly runs in one CPU job (needs "
                        "DSPARK_SGLANG_PYTHON or `bash .ci/sglang-resolver.sh`)")
    parser.add_argument("--k8s-extra", metavar="FILE",
                        help="with --format k8s: YAML patch merged into every generated object (docs/K8S.md)")


def select(cells: list[Cell], patterns: list[str] | None) -> list[Cell]:
    if not patterns:
        return cells
    chosen = [c for c in cells if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
    if not chosen:
        raise BadInput("--select", f"{' '.join(patterns)} matches none of the {len(cells)} cells",
                       "list the ids with `dspark-ci plan MATRIX --format table` and use a glob such as '*dpattn*'")
    return chosen


def launch_plans(cells: list[Cell]) -> dict[str, LaunchPlan]:
    """Every colocated cell's plan on the printed template placement (also validates extra_args and flags)."""
    return {cell.id: plan_launch(cell, Placement.template(cell.nnodes)) for cell in cells if not cell.disaggregated}


def pd_plans(cells: list[Cell]) -> dict[str, PDPlan]:
    """Every disaggregated cell's role instances and router, on the template placement."""
    return {cell.id: plan_pd(cell) for cell in cells if cell.disaggregated}


def render_json(cells: list[Cell], plans: dict[str, LaunchPlan]) -> str:
    pd = pd_plans(cells)
    entries = [{**cell.to_dict(), "ranks": plans[cell.id].to_dict()} if cell.id in plans
               else {**cell.to_dict(), "ranks": [], "pd": pd[cell.id].to_dict()} for cell in cells]
    return json.dumps({"cells": entries}, indent=2)


def render_pd_commands(cells: list[Cell]) -> str:
    """Below the table: each disaggregated cell's exact command per role instance and node rank, and the router's."""
    blocks = []
    for cell_id, pd in pd_plans(cells).items():
        lines = [f"{cell_id}:"]
        for instance in pd.instances:
            for rank in instance.plan.ranks:
                lines.append(f"  {instance.label} node rank {rank.node_rank}: {' '.join(rank.argv)}")
        lines.append(f"  router ({pd.router.base_url}): {' '.join(pd.router.argv)}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def github_matrix(cells: list[Cell], decided: frozenset[str] = frozenset()) -> tuple[dict, str | None]:
    """The strategy.matrix object, and a note for stderr when it had to be split. Cells in ``decided`` (expected
    rejections SGLang's resolver decides without a launch) say so: ``"decided_by": "resolver"``."""
    include = [{"cell": c.id, "runner": c.runner, "matrix": c.matrix, "expect": c.expect.outcome,
                "nnodes": c.nnodes, **({"decided_by": DECIDED_BY_RESOLVER} if c.id in decided else {}),
                **({"roles": {r.name: {"runner": r.runner, "count": r.count} for r in c.roles}} if c.roles else {})}
               for c in cells]
    if len(include) <= GITHUB_MAX_JOBS:
        return {"include": include}, None
    chunks = [{"include": include[i:i + GITHUB_MAX_JOBS]} for i in range(0, len(include), GITHUB_MAX_JOBS)]
    sizes = ", ".join(str(len(chunk["include"])) for chunk in chunks)
    note = (f"{len(include)} cells exceed GitHub's {GITHUB_MAX_JOBS} jobs per matrix: split into "
            f"{len(chunks)} chunks ({sizes}) under \"chunks\"; use fromJSON(...).chunks[0] .. "
            f"chunks[{len(chunks) - 1}] in separate jobs")
    return {"chunks": chunks}, note


def render_github(cells: list[Cell], plans: dict[str, LaunchPlan], decided: frozenset[str] = frozenset()) -> str:
    matrix, note = github_matrix(cells, decided)
    if note:
        print(f"dspark-ci plan: {note}", file=sys.stderr)
    return json.dumps(matrix, separators=(",", ":"))


def _layout(c: Cell) -> str:
    return _layout_of(c.config)


def _layout_of(cfg) -> str:
    dp = f"attn{cfg.dp}" if cfg.enable_dp_attention else str(cfg.dp)
    return f"{cfg.tp}/{dp}/{cfg.cp}/{cfg.pp}"


def _spec(c: Cell) -> str:
    algorithm, block = c.config.speculative_algorithm, c.config.speculative_block_size
    return f"{algorithm}({block})" if algorithm and block else (algorithm or "-")


# Table columns: header -> value of a cell.
TABLE_COLUMNS: dict[str, Callable[[Cell], str]] = {
    "id": lambda c: c.id,
    "runner": lambda c: c.runner,
    "expect": lambda c: c.expect.outcome,
    "tp/dp/cp/pp": _layout,
    "a2a": lambda c: c.config.moe_a2a_backend,
    "spec": _spec,
    "nodes": lambda c: str(c.nnodes),
}
# Shown when a matrix has disaggregated cells.
ROLES_COLUMN: dict[str, Callable[[Cell], str]] = {
    "roles": lambda c: " ".join(f"{r.name}×{r.count} {_layout_of(r.config)}" for r in c.roles) or "-"}


def render_table(cells: list[Cell], plans: dict[str, LaunchPlan]) -> str:
    columns = {**TABLE_COLUMNS, **(ROLES_COLUMN if any(c.disaggregated for c in cells) else {})}
    rows = [[column(c) for column in columns.values()] for c in cells]
    commands = render_pd_commands(cells)
    return text_table(list(columns), rows) + f"\n{len(cells)} cells" + (f"\n\n{commands}" if commands else "")


def render_k8s(cells: list[Cell], plans: dict[str, LaunchPlan], extra: str | None = None) -> str:
    patches = k8s_spec.load_patches(extra)
    objects = [obj for cell in cells for obj in (pd_manifests(cell, None, patches) if cell.disaggregated else
                                                 k8s_spec.manifests(plans[cell.id], name=k8s_spec.object_name(cell.id),
                                                                    namespace=None, hardware=cell.config.hardware,
                                                                    patches=patches))]
    return k8s_spec.to_yaml(objects).rstrip("\n")


RENDERERS: dict[str, Callable[[list[Cell], dict[str, LaunchPlan]], str]] = {
    "json": render_json,
    "github": render_github,
    "table": render_table,
}


def run(args: argparse.Namespace) -> int:
    cells = select(load_cells(args.matrices), args.select)
    plans = launch_plans(cells)  # every format validates the command lines, not only json
    if args.format == "k8s":
        print(render_k8s(cells, plans, args.k8s_extra))
        return 0
    if args.format == "github" and args.rejections == "resolver":
        decided = frozenset(decide_rejections(cells, DEFAULT_VERSION).results)
        print(render_github(cells, plans, decided))
        return 0
    print(RENDERERS[args.format](cells, plans))
    return 0
