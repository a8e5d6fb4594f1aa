"""Launch plans for the simulated server that the launcher tests (local and Docker) share."""

from __future__ import annotations

from dspark_ci.launchers.plan_types import SGLANG_ENTRYPOINT, LaunchPlan, NodeFlags, Placement, RankCommand

# A quick boot (still long enough to be awaited) and fast decoding.
FAST_SIM = {"DSPARK_SIM_BOOT_SECONDS": "0.2", "DSPARK_SIM_DECODE_STEP_MS": "1", "DSPARK_SIM_PREFILL_MS_PER_TOKEN": "0"}


def make_plan(placement: Placement, nnodes: int, cell_id: str, env: dict | None = None) -> LaunchPlan:
    """SGLang's own multi-node command line (the planner's shape), for a tiny simulated model served under
    the name ``cell_id``; every rank's environment references ``${HF_TOKEN}``, a secret the logs must not show."""
    ranks = []
    for rank in range(nnodes):
        head = [*SGLANG_ENTRYPOINT, "--model-path", "sim/tiny", "--served-model-name", cell_id]
        node = NodeFlags(host=placement.bind_hosts[rank], port=placement.port, nnodes=nnodes, node_rank=rank,
                         leader_addr=placement.leader_addr, dist_port=placement.dist_port)
        ranks.append(RankCommand(rank, head, {"HF_TOKEN": "${HF_TOKEN}", **(env or {})}, node=node))
    base = f"http://{placement.bind_hosts[0]}:{placement.port}"
    return LaunchPlan(cell_id=cell_id, ranks=tuple(ranks), health_url=f"{base}/health", base_url=base)
