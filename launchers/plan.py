"""Cell + Placement -> LaunchPlan: the exact ``python3 -m sglang.launch_server`` argv and env per node.

The argv targets SGLang 0.5.23 (sglang/srt/arg_groups/fields/*.py): ``FLAG_RULES`` maps config
keys to flags, one rule per row, and every flag emitted is checked against the 0.5.23 snapshot
(``ground.sglang.flags``). Every node runs the same command plus its own ``--host``,
``--node-rank`` (multi-node) and the leader's ``--dist-init-addr``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ground.errors import BadInput
from ground.sglang.flags import FlagSet, load_flags
from ground.sglang.release import BLOCK_SIZE_FLAGS
from launchers.plan_types import SGLANG_ENTRYPOINT, LaunchPlan, Placement, RankCommand
from matrices.cell import Cell

_WILDCARD_HOSTS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class FlagRule:
    keys: tuple[str, ...]  # config keys the rule reads
    render: Callable[[Mapping[str, Any]], list[str]]  # config -> argv fragment ([] = nothing to say)


def value(flag: str, key: str) -> FlagRule:
    """``--flag VALUE`` whenever the config sets the key."""
    return FlagRule((key,), lambda c: [flag, str(c[key])] if c.get(key) is not None else [])


def value_unless(flag: str, key: str, default) -> FlagRule:
    """``--flag VALUE`` when the value differs from SGLang's default (keeps argv short and readable)."""
    return FlagRule((key,), lambda c: [flag, str(c[key])] if c.get(key, default) != default else [])


def switch(flag: str, key: str) -> FlagRule:
    """``--flag`` when the key is true."""
    return FlagRule((key,), lambda c: [flag] if c.get(key) else [])


def _data_parallel(c: Mapping[str, Any]) -> list[str]:
    # 0.5.23 deprecates `--dp-size N --enable-dp-attention` in favour of `--attn-dp-size N`
    # (parallel_hook.handle_deprecated_dp_attention); plain --dp-size counts model replicas.
    if c["dp"] == 1:
        return []
    return ["--attn-dp-size" if c["enable_dp_attention"] else "--dp-size", str(c["dp"])]


def _context_parallel(c: Mapping[str, Any]) -> list[str]:
    # CP v2: strategy-based prefill CP. DeepSeek-V4 derives attn_cp_size = tp / attn_dp itself
    # (deepseek_v4_hook.validate_deepseek_v4_cp); other models read --attn-cp-size.
    if c["cp"] == 1:
        return []
    return ["--enable-prefill-cp", "--cp-strategy", c.get("cp_strategy") or "interleave",
            "--attn-cp-size", str(c["cp"])]


def _block_size(c: Mapping[str, Any]) -> list[str]:
    size = c.get("speculative_block_size")
    return [BLOCK_SIZE_FLAGS[c["speculative_algorithm"]], str(size)] if size is not None else []


# Config keys -> launch_server flags, in argv order. Keys without a row here (model_slug,
# hardware, nnodes, gpus_per_node) describe placement, not SGLang arguments.
FLAG_RULES: tuple[FlagRule, ...] = (
    value("--model-path", "model"),
    value("--device", "device"),
    value("--tp-size", "tp"),
    value_unless("--pp-size", "pp", 1),
    FlagRule(("dp", "enable_dp_attention"), _data_parallel),
    switch("--enable-dp-lm-head", "enable_dp_lm_head"),
    FlagRule(("cp", "cp_strategy"), _context_parallel),
    value("--moe-a2a-backend", "moe_a2a_backend"),
    value("--speculative-algorithm", "speculative_algorithm"),
    value("--speculative-draft-model-path", "draft_model"),
    FlagRule(("speculative_block_size",), _block_size),
    value("--speculative-num-steps", "speculative_num_steps"),
    value("--speculative-eagle-topk", "speculative_eagle_topk"),
    value("--speculative-num-draft-tokens", "speculative_num_draft_tokens"),
    value("--reasoning-parser", "reasoning_parser"),
    switch("--trust-remote-code", "trust_remote_code"),
    switch("--enable-metrics", "enable_metrics"),
)
PLACEMENT_KEYS = ("model_slug", "hardware", "nnodes", "gpus_per_node")

# Environment the planner adds because of a config value: (applies?, variables).
DERIVED_ENV: tuple[tuple[Callable[[Mapping[str, Any]], bool], Mapping[str, str]], ...] = (
    # CP v2 was switched on by this variable before 0.5.23; 0.5.23 only warns that it is
    # deprecated (environ._DEPRECATED_ENVS), so one command line serves both.
    (lambda c: c["cp"] > 1, {"SGLANG_ENABLE_CP_V2": "1"}),
)


def _node_flags(cell: Cell, placement: Placement, rank: int) -> list[str]:
    flags = ["--host", placement.bind_hosts[rank], "--port", str(placement.port)]
    if cell.nnodes > 1:
        flags += ["--nnodes", str(cell.nnodes), "--node-rank", str(rank),
                  "--dist-init-addr", f"{placement.leader_addr}:{placement.dist_port}"]
    return flags


def _check_flags(argv: list[str], emitted: list[str], cell: Cell, flags: FlagSet) -> None:
    """Every flag exists in the snapshot, and extra_args does not repeat a flag the config sets."""
    where = f"{cell.matrix}:{cell.line}" if cell.line else cell.matrix
    for token in argv[len(SGLANG_ENTRYPOINT):]:
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
    config_args = [arg for rule in FLAG_RULES for arg in rule.render(cell.config)]
    env = dict(cell.env)
    for applies, variables in DERIVED_ENV:
        if applies(cell.config):
            env.update(variables)
    ranks = []
    for rank in range(cell.nnodes):
        node_args = _node_flags(cell, placement, rank)
        argv = [*SGLANG_ENTRYPOINT, *config_args, *node_args, *cell.extra_args]
        _check_flags(argv, config_args + node_args, cell, flags)
        ranks.append(RankCommand(node_rank=rank, argv=tuple(argv), env=env))
    base_url = f"http://{_connect_host(placement)}:{placement.port}"
    gpus = cell.config.get("gpus_per_node")
    return LaunchPlan(cell_id=cell.id, ranks=tuple(ranks), health_url=f"{base_url}/health",
                      base_url=base_url, image=cell.image, gpus_per_node=int(gpus) if gpus is not None else None,
                      hardware=cell.config.get("hardware"))
