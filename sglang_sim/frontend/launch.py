"""Node rank 0 of ``--server sglang-frontend``: SGLang's own ``launch_server`` on this CPU, its scheduler
played by the simulator's engine (``scheduler.py``).

Runs inside the SGLang venv (``.ci/sglang-frontend.sh``). Everything before the launch is the simulator's own
(``dspark_ci.sglang_sim.main``: SGLang's argv parsed against the flag snapshot, ``DSPARK_SIM_*``, the boot_reject fault,
admission), so a launch is refused exactly as the simulator refuses it, and node ranks >= 1 are the
simulator's. Rank 0 then writes a model directory (``vocab.py``) and hands SGLang a CPU command line: the
cell's serving flags (speculative algorithm and draft-token count, reasoning parser, metrics, warmup, API key,
context length) on one CPU device; the parallel layout and the hardware stay the simulated engine's, which reads
the cell's own argv (``SIM_ARGV_ENV``).
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import json
import logging
import os
import tempfile
import threading
from pathlib import Path

from dspark_ci.sglang_sim.admission import SglangEnv
from dspark_ci.sglang_sim.args import ServerArgs, parse_server_args
from dspark_ci.sglang_sim.failures import SCHEDULER_FRAMES, print_lines, traceback_tail
from dspark_ci.sglang_sim.frontend import ROOT_ENV
from dspark_ci.sglang_sim.frontend.vocab import Vocabulary, write_model_dir
from dspark_ci.sglang_sim.gpqa_answers import GpqaAnswerKey
from dspark_ci.sglang_sim.rendezvous import Leader, split_addr
from dspark_ci.sglang_sim.sim_config import KNOBS, SimConfig
from dspark_ci.sglang_sim.tokenizer import onig_pattern

logger = logging.getLogger("sglang_sim")
SIM_ARGV_ENV = "DSPARK_FRONTEND_SIM_ARGV"  # the cell's argv (JSON)
ADMITTED_ENV = "DSPARK_FRONTEND_ADMITTED"  # the simulator's admitted args and architecture, for the scheduler
PATH_KNOBS = ("gpqa_path", "emission_log")
# Text whose words the tokenizer must hold as its own (the prompts clients will send; dspark-ci run sets the
# suites'): such a prompt reaches the engine as the simulator would read it, so the reply and the acceptance
# draws are the simulator's for the same request.
VOCABULARY_ENV = "DSPARK_FRONTEND_VOCABULARY"  # DSPARK_SIM_* paths, made absolute before the process moves
MODEL_DIR_ENV = "DSPARK_FRONTEND_MODEL_DIR"
# A small Llama: what SGLang's front end reads of a model (context length, eos, architecture); no weights load.
MODEL_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
                "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05,
                "rope_theta": 500000.0, "bos_token_id": 0, "tie_word_embeddings": False}
DRAFT_FREE_ALGORITHM = "NGRAM"  # the speculative algorithm SGLang admits on a CPU without a draft model


def _value_flags(args: ServerArgs) -> list[str]:
    """The cell's flags that shape what the front end does, as SGLang reads them."""
    pairs = (("--served-model-name", args.model_name), ("--api-key", args.api_key),
             ("--context-length", args.context_length), ("--max-running-requests", args.max_running_requests),
             ("--reasoning-parser", args.reasoning_parser), ("--log-level", args.log_level),
             ("--decode-log-interval", args.decode_log_interval))
    switches = (("--enable-metrics", args.enable_metrics), ("--skip-server-warmup", args.skip_server_warmup),
                ("--stream-response-default-include-usage", args.stream_response_default_include_usage),
                ("--enable-cache-report", args.enable_cache_report), ("--return-input-ids", args.return_input_ids),
                ("--return-output-ids", args.return_output_ids))
    flags = [word for flag, value in pairs if value is not None for word in (flag, str(value))]
    return flags + [flag for flag, on in switches if on]


def frontend_argv(args: ServerArgs, model_dir: Path) -> list[str]:
    """SGLang's launch_server argv for the front end on this CPU."""
    argv = ["--model-path", str(model_dir), "--tokenizer-path", str(model_dir), "--host", args.host,
            "--port", str(args.port), "--device", "cpu",
            "--load-format", "dummy", "--tp-size", "1", *_value_flags(args)]
    if args.speculative_algorithm is not None:
        # The front end's speculative statistics (meta_info, sglext) need only the draft-token count: the
        # engine behind it speculates as the cell's algorithm does.
        argv += ["--speculative-algorithm", DRAFT_FREE_ALGORITHM,
                 "--speculative-num-draft-tokens", str(args.speculative_num_draft_tokens or 2)]
    return argv


def _gpqa_rows(path: Path | None) -> list[dict]:
    if path is None:
        return []
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def write_model(config: SimConfig, model_path: str) -> Path:
    """The model directory, at ``model_path`` relative to a fresh working directory (the process moves there),
    so SGLang reports the cell's own --model-path (a Hub id) in /model_info and /server_info."""
    if not os.environ.get(ROOT_ENV):  # normally the supervising process made it (__main__)
        os.environ[ROOT_ENV] = tempfile.mkdtemp(prefix="dspark-frontend-")
    root = Path(os.environ[ROOT_ENV])
    relative = Path(model_path)
    directory = root / (relative if not relative.is_absolute() and ".." not in relative.parts else "model")
    vocabulary = Vocabulary.build(_gpqa_rows(config.gpqa_path), [os.environ.get(VOCABULARY_ENV, "")])
    write_model_dir(directory, vocabulary, MODEL_CONFIG, onig_pattern())
    os.chdir(root)
    return directory


def cell_server_args(argv: list[str]) -> dict:
    """SGLang's own resolution of the cell's argv (prepare_server_args + resolve_once, on this CPU, against the
    model's config stub): what /server_info reports for it, in place of the front end's CPU launch. Empty when
    the resolution needs hardware (the front end's own values stay)."""
    from dspark_ci.ground.sglang.resolver import MODEL_CONFIG_DIR, prepare_argv
    from sglang.srt.server_args import prepare_server_args

    try:
        resolved = prepare_server_args(prepare_argv(argv, str(MODEL_CONFIG_DIR)))
        resolved.resolve_once()
        values = resolved.resolved_dict()
    except Exception as err:  # admitted by the simulator: only a probe of the hardware can refuse it here
        logger.warning(f"[sglang_sim frontend] /server_info keeps the front end's own arguments: resolving the "
                       f"cell's needs the hardware ({type(err).__name__}: {err})")
        return {}
    parsed = parse_server_args(argv)
    values.update(model_path=parsed.model_path, tokenizer_path=parsed.tokenizer_path or parsed.model_path,
                  served_model_name=parsed.model_name)
    return values


class ReportedArgs:
    """The front end's ServerArgs, reporting the cell's resolution (``cell_server_args``) where /server_info
    reads it (``build_server_info`` calls ``resolved_dict``); everything else is the front end's own."""

    def __init__(self, server_args, cell: dict, launch_command: str):
        self._server_args, self._cell, self._launch_command = server_args, cell, launch_command

    @property
    def launch_command(self) -> str:
        """The cell's command line (build_server_info reports it beside the resolved fields)."""
        return self._launch_command

    def resolved_dict(self) -> dict:
        own = self._server_args.resolved_dict()
        return {**own, **{key: value for key, value in self._cell.items() if key not in FRONTEND_OWN_FIELDS}}

    def __getattr__(self, name: str):
        return getattr(self._server_args, name)


def wait_for_every_dp_rank(manager, args: ServerArgs) -> None:
    """/server_info's internal_states: SGLang's TokenizerManager waits for one GetInternalStateReqOutput per
    scheduler DP rank (its communicator's fan-out is the DP rank count); the front end launches one scheduler,
    which answers for each of the cell's DP ranks (``scheduler.StandIn.internal_states``)."""
    manager.get_internal_state_communicator.set_fan_out(args.num_dp_ranks)


# What the front end really serves with, whatever the cell's resolution says.
FRONTEND_OWN_FIELDS = ("host", "port", "random_seed", "nccl_port")


def hand_over(args: ServerArgs, architecture: str) -> None:
    """What the scheduler process needs of this launch, in the environment it inherits: the admitted args
    (admission cannot run again there: the working directory then holds a model directory by the model's name)
    and the DSPARK_SIM_* paths made absolute."""
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.name != "other_flags"}
    os.environ[ADMITTED_ENV] = json.dumps({"fields": fields, "other_flags": dict(args.other_flags),
                                           "architecture": architecture}, default=str)
    for name in PATH_KNOBS:
        variable = KNOBS[name].env
        if os.environ.get(variable):
            os.environ[variable] = str(Path(os.environ[variable]).expanduser().resolve())


def admitted() -> tuple[ServerArgs, str]:
    """In the scheduler process: the admitted args and architecture ``hand_over`` left."""
    state = json.loads(os.environ[ADMITTED_ENV])
    return ServerArgs(**state["fields"], other_flags=state["other_flags"]), state["architecture"]


def die_with_server(lines: list[str]) -> None:
    """What SGLang's launching process does when a scheduler dies: its error, then the whole tree goes."""
    from sglang.srt.utils.common import kill_process_tree

    print_lines(lines)
    kill_process_tree(os.getpid(), include_parent=False)
    os._exit(1)


def gather_node_ranks(args: ServerArgs, config: SimConfig) -> None:
    """Multi-node: listen at --dist-init-addr for the node ranks >= 1 (the simulator's, dspark_ci.sglang_sim.rendezvous)
    from a thread of this process, before SGLang's slow start, and return once all have joined. A rank lost later
    takes the server down, as a lost NCCL peer does. The rank_exit fault for rank 0 is armed here too."""
    joined = threading.Event()

    async def lead() -> None:
        leader = Leader(args.nnodes, on_rank_lost=lambda rank: die_with_server(traceback_tail(SCHEDULER_FRAMES, (
            f"RuntimeError: NCCL communicator was aborted: node rank {rank} disconnected "
            "(sglang_sim: a peer rank exited)"))))
        if config.faults.rank_exit is not None and config.faults.rank_exit[0] == 0:
            seconds = config.faults.rank_exit[1]
            asyncio.get_running_loop().call_later(seconds, die_with_server, traceback_tail(
                SCHEDULER_FRAMES, f"RuntimeError: [sglang_sim fault rank_exit] node rank 0 exits after {seconds:g} s"))
        if args.nnodes > 1:
            await leader.listen(*split_addr(args.dist_init_addr or f"{args.host}:20000"))
            logger.info(f"Waiting for {args.nnodes - 1} other node ranks to join at {args.dist_init_addr}.")
            await leader.everyone_joined.wait()
        joined.set()
        await asyncio.Event().wait()

    threading.Thread(target=asyncio.run, args=(lead(),), name="node-ranks", daemon=True).start()
    joined.wait()


def serve(args: ServerArgs, config: SimConfig, env: SglangEnv, architecture: str, answer_key: GpqaAnswerKey) -> int:
    """Launch SGLang's front end; returns when it stops (SIGTERM: SGLang's own shutdown)."""
    from dspark_ci.sglang_sim.frontend import scheduler
    from sglang.srt.entrypoints.engine import init_tokenizer_manager
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args

    cell = cell_server_args(json.loads(os.environ[SIM_ARGV_ENV]))
    hand_over(args, architecture)
    gather_node_ranks(args, config)
    model_dir = write_model(config, args.model_path)
    os.environ[MODEL_DIR_ENV] = str(model_dir)
    argv = frontend_argv(args, model_dir.relative_to(Path.cwd()))

    def tokenizer_manager(server_args, port_args):
        manager, templates = init_tokenizer_manager(server_args, port_args)
        manager.server_args = ReportedArgs(manager.server_args, cell, args.launch_command)
        wait_for_every_dp_rank(manager, args)
        return manager, templates

    logger.info(f"[sglang_sim frontend] SGLang's own front end: launch_server {' '.join(argv)}")
    try:
        launch_server(prepare_server_args(argv), init_tokenizer_manager_func=tokenizer_manager,
                      run_scheduler_process_func=scheduler.run_scheduler_process)
        code = 0
    except BaseException as err:  # a child that died before the handshake (its own lines are in the log)
        logger.error(f"[sglang_sim frontend] launch_server failed: {type(err).__name__}: {err}")
        code = 1
    # SGLang's launching process can outlive its server (threads, children): take the whole tree down.
    from sglang.srt.utils.common import kill_process_tree

    kill_process_tree(os.getpid(), include_parent=False)
    os._exit(code)  # the scratch directory goes with the supervising process (__main__)


def remember_argv(argv: list[str]) -> None:
    os.environ[SIM_ARGV_ENV] = json.dumps(argv)
