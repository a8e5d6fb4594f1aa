"""Cell + Placement -> LaunchPlan: the exact ``python3 -m sglang.launch_server`` argv and env per node.

The settings' flags come from their rows (``ground/sglang/settings.py``: one row per setting, with its
flag and rule), and every flag emitted is checked against the release's snapshot (``dspark_ci.ground.sglang.flags``).
Every node runs the same command plus its own ``--host``, ``--node-rank`` (multi-node) and the leader's
``--dist-init-addr``.
"""

from __future__ import annotations

from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.sglang.flags import FlagSet, load_flags
from dspark_ci.ground.sglang.settings import launch_args, launch_env, served_bootstrap_port
from dspark_ci.launchers.plan_types import SGLANG_ENTRYPOINT, LaunchPlan, NodeFlags, Placement, RankCommand
from dspark_ci.matrices.cell import Cell

_WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def _node_flags(cell: Cell, placement: Placement, rank: int) -> NodeFlags:
    return NodeFlags(host=placement.bind_hosts[rank], port=placement.port, nnodes=cell.nnodes, node_rank=rank,
                     leader_addr=placement.leader_addr, dist_port=placement.dist_port)


def _check_flags(emitted: list[str], cell: Cell, flags: FlagSet) -> None:
    """Every flag exists in the snapshot, and extra_args does not repeat a flag the config sets."""
    where = f"{cell.matrix}:{cell.line}" if cell.line else cell.matrix
    for token in emitted:  # from the settings' rows and the placement: ours to fix, not the matrix's
        if token.startswith("--") and flags.get(token.split("=", 1)[0]) is None:
            raise BadInput(where, f"cell {cell.id}: {token} (from a setting's row) is not a flag of SGLang "
                           f"{flags.version}'s launch_server", "the row's flag rule in ground/sglang/settings.py "
                           "names a flag this release lacks: fix the row, or drop the setting from this cell")
    for token in cell.extra_args:
        name = token.split("=", 1)[0]
        if token.startswith("--") and flags.get(name) is None:
            raise BadInput(where, f"cell {cell.id}: {name} is not a flag of SGLang {flags.version}'s launch_server",
                           "remove it from extra_args (flags are checked against ground/sglang/flags-*.json)")
    planned = {flag.dest: t for t in emitted if t.startswith("--") and (flag := flags.get(t)) is not None}
    for token in cell.extra_args:
        flag = flags.get(token.split("=", 1)[0]) if token.startswith("--") else None
        if flag is not None and flag.dest in planned:
            raise BadInput(where, f"cell {cell.id}: extra_args repeats {planned[flag.dest]}, which the matrix "
                           "config already sets", f"remove {token} from extra_args and set the config key instead")


def _connect_host(placement: Placement) -> str:
    bind = placement.bind_hosts[0]
    return placement.leader_addr if bind in _WILDCARD_HOSTS else bind


def plan_launch(cell: Cell, placement: Placement, flags: FlagSet | None = None) -> LaunchPlan:
    """The per-node commands that start ``cell`` on ``placement`` (one bind host per node)."""
    if len(placement.bind_hosts) < cell.nnodes:
        raise ValueError(f"placement has {len(placement.bind_hosts)} hosts, cell {cell.id} needs {cell.nnodes}")
    flags = flags or load_flags()
    config_args = launch_args(cell.config)
    env = {**cell.env, **launch_env(cell.config)}
    ranks = []
    for rank in range(cell.nnodes):
        node = _node_flags(cell, placement, rank)
        _check_flags(config_args + node.words(), cell, flags)
        ranks.append(RankCommand(node_rank=rank, head=(*SGLANG_ENTRYPOINT, *config_args), env=env, node=node,
                                 tail=cell.extra_args))
    base_url = f"http://{_connect_host(placement)}:{placement.port}"
    return LaunchPlan(cell_id=cell.id, ranks=tuple(ranks), health_url=f"{base_url}/health",
                      base_url=base_url, image=cell.image, gpus_per_node=cell.config.gpus_per_node,
                      hardware=cell.config.get("hardware"), device=cell.config["device"],
                      bootstrap_port=served_bootstrap_port(cell.config))
