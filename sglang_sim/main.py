"""``python -m dspark_ci.sglang_sim [SGLang launch_server flags]``: parse, admit, then serve as the node rank says.

Exit codes: 2 for argv SGLang's parser refuses (and for unusable ``DSPARK_SIM_*`` values), 1 for a
launch SGLang rejects, a busy port (one line) or a crash (the last stderr line is SGLang's error line),
0 after SIGTERM/SIGINT. ``--help`` documents the ``DSPARK_SIM_*`` knobs and faults, then lists SGLang's flags.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable

from aiohttp import web
from dspark_ci.sglang_sim import mc_logprobs, native_api
from dspark_ci.sglang_sim.admission import Rejected, SglangEnv, admit, guess_architecture
from dspark_ci.sglang_sim.args import ServerArgs, parse_server_args
from dspark_ci.sglang_sim.disaggregation import Disaggregation, role_environ
from dspark_ci.sglang_sim.emission_log import EmissionLog
from dspark_ci.sglang_sim.engine import Engine
from dspark_ci.sglang_sim.engine_shards import Shard, serve_sharded, usable_cores
from dspark_ci.sglang_sim.failures import SCHEDULER_FRAMES, die, print_lines, rejection_traceback, traceback_tail
from dspark_ci.sglang_sim.gpqa_answers import GpqaAnswerKey, GpqaDatasetError
from dspark_ci.sglang_sim.http_app import api_app, dummy_health_app, shard_peer_app
from dspark_ci.sglang_sim.noise import BootNoise
from dspark_ci.sglang_sim.prometheus import ServerMetrics
from dspark_ci.sglang_sim.rendezvous import Leader, join, split_addr
from dspark_ci.sglang_sim.server_state import ServerState
from dspark_ci.sglang_sim.sim_config import KNOBS, SimConfig, SimConfigError
from dspark_ci.sglang_sim.speculation import SpecShape
from dspark_ci.sglang_sim.textgen import Persona

logger = logging.getLogger("sglang_sim")
SHUTDOWN_GRACE_SECONDS = 1.0
GC_FULL_EVERY = 1000  # generation-1 collections per full one (Python's default: 10)


def main(argv: list[str] | None = None, serve_rank0: ServeRank0 | None = None) -> int:
    """``serve_rank0``: what node rank 0 runs once the launch is admitted (default: the simulator's own HTTP
    server; ``dspark_ci.sglang_sim.frontend``: SGLang's own front end in front of this engine)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_server_args(argv)  # argparse exits 2 by itself
    try:
        config = SimConfig.from_env(role_environ(os.environ, args.disaggregation_mode))
        answer_key = GpqaAnswerKey.load(config.gpqa_path)
        mc_logprobs.answer_key(config.mc_path)  # a bad file is said at start, not on the first MC request
    except (SimConfigError, GpqaDatasetError, mc_logprobs.McKeyError) as err:
        print(f"sglang_sim: {err}", file=sys.stderr)
        return 2
    busy = _port_taken(args.host, args.port)
    if busy:  # one line naming the port, before the launch line (uvicorn's bind error, exit 1 as SGLang's)
        print_lines([busy])
        return 1
    _setup_logging(args.log_level)
    env = SglangEnv.from_environ(os.environ)
    if env.enable_cp_v2_set:
        logger.warning("Environment variable SGLANG_ENABLE_CP_V2 is deprecated. Strategy-based prefill context "
                       "parallelism is now the only generic implementation.")
    logger.info(f"server_args={args.describe()}")
    if config.regression is not None:
        logger.info(f"[sglang_sim] version {config.version or 'default'}; regression planted at "
                    f"{config.regression.since}{' (applied)' if config.regression.applies_to(config.version) else ''}")
    if config.faults.names:
        logger.info(f"[sglang_sim] injected faults: {', '.join(config.faults.names)}")
    if config.faults.boot_reject is not None:
        print_lines(rejection_traceback("speculative_hook.py:handle_speculative_decoding",
                                        f"ValueError: {config.faults.boot_reject}"))
        return 1
    architecture = guess_architecture(args.model_path, config.architecture)
    try:
        resolved = admit(args, env, architecture)
    except Rejected as rejection:
        print_lines(rejection_traceback(rejection.hook, rejection.line))
        return 1
    if resolved.node_rank != 0:
        return _run(_serve_other_rank(resolved, config))
    if serve_rank0 is not None:
        return serve_rank0(resolved, config, env, architecture, answer_key)
    try:
        shards = _shard_count(resolved, config)
    except ValueError as err:
        print(f"sglang_sim: {err}", file=sys.stderr)
        return 2
    if shards == 1:
        return _serve(resolved, config, env, architecture, answer_key)
    return _serve_shards(shards, resolved, config, env, architecture, answer_key)


# (admitted args, config, SGLang's environment, architecture, GPQA answer key) -> exit code
ServeRank0 = Callable[[ServerArgs, SimConfig, SglangEnv, str, GpqaAnswerKey], int]


def _shard_count(args: ServerArgs, config: SimConfig) -> int:
    """DSPARK_SIM_SHARDS resolved against the launch (auto: one per DP rank, at most one per usable core, and one
    where shards cannot be: several node ranks or a PD role); ValueError when an explicit count cannot be had."""
    env = KNOBS["shards"].env
    single = args.nnodes > 1 or args.disaggregation_mode != "null"
    if config.shards is None:
        return 1 if single else max(1, min(args.num_dp_ranks, usable_cores()))
    if config.shards > 1 and single:
        raise ValueError(f"{env}={config.shards}: shards serve one node without PD disaggregation; set it to 1 "
                         "with --nnodes > 1 or --disaggregation-mode")
    if config.shards > args.num_dp_ranks:
        raise ValueError(f"{env}={config.shards}: each shard schedules whole DP ranks and this launch has "
                         f"{args.num_dp_ranks}; raise --dp-size (or --attn-dp-size) or lower {env}")
    return config.shards


def _open_emission_log(config: SimConfig) -> EmissionLog | None:
    """Raises OSError (the caller's exit 2) when the log cannot be appended to."""
    return EmissionLog.open(config.emission_log) if config.emission_log is not None else None


def _emission_log_error(config: SimConfig, err: OSError) -> int:
    print(f"sglang_sim: {KNOBS['emission_log'].env}={config.emission_log}: cannot append to it "
          f"({err.strerror or err})", file=sys.stderr)
    return 2


def _serve(args: ServerArgs, config: SimConfig, env: SglangEnv, architecture: str,
           answer_key: GpqaAnswerKey, noise: BootNoise | None = None, shard: Shard | None = None) -> int:
    """Serve node rank 0 (or one shard of it). It owns the emission log: exit 2 when it cannot be appended to."""
    try:
        emission_log = _open_emission_log(config)
    except OSError as err:
        return _emission_log_error(config, err)
    try:
        return _run(_serve_rank0(args, config, env, architecture, answer_key, emission_log, noise, shard))
    finally:
        if emission_log is not None:
            emission_log.close()


def _serve_shards(count: int, args: ServerArgs, config: SimConfig, env: SglangEnv, architecture: str,
                  answer_key: GpqaAnswerKey) -> int:
    """Node rank 0 as ``count`` shard processes (dspark_ci.sglang_sim.engine_shards), one boot's noise drawn for them
    all."""
    try:
        log = _open_emission_log(config)  # each shard appends on its own; a bad path is found before the fork
    except OSError as err:
        return _emission_log_error(config, err)
    if log is not None:
        log.close()
    noise = BootNoise.of(config)
    return serve_sharded(count, lambda shard: _serve(args, config, env, architecture, answer_key, noise, shard))


def _run(serving) -> int:
    try:
        return asyncio.run(serving)
    except OSError as err:  # e.g. the port is taken
        print_lines([f"OSError: {err}"])
        return 1


def _port_taken(host: str, port: int) -> str | None:
    """The bind error this server would hit on ``host:port``, as one line, or None when it can bind (the real bind
    happens later; this only keeps a busy port from being reported after the whole launch configuration)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds: TIME_WAIT is no reason
            probe.bind(address)
    except OSError as err:
        if err.errno not in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
            return None  # anything else (an unresolvable host, ...) is reported by the real bind
        return (f"OSError: [Errno {err.errno}] error while attempting to bind on address {(host, port)!r}: "
                f"{(err.strerror or str(err)).lower()}")
    return None


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), format="[%(asctime)s] %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S", force=True)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return stop


def _arm_rank_exit(config: SimConfig, node_rank: int) -> None:
    """Fault rank_exit=RANK:SECONDS: this node rank dies that long after start."""
    if config.faults.rank_exit is None or config.faults.rank_exit[0] != node_rank:
        return
    seconds = config.faults.rank_exit[1]
    asyncio.get_running_loop().call_later(seconds, die, traceback_tail(
        SCHEDULER_FRAMES,
        f"RuntimeError: [sglang_sim fault rank_exit] node rank {node_rank} exits after {seconds:g} s"))


def _crash_on_prefill(config: SimConfig):
    """Fault crash_first_prefill: the first real prefill kills the server (crash_once: only while its marker file
    does not exist yet, which the crash creates)."""
    def on_prefill() -> None:
        once = config.faults.crash_once
        if once and not os.path.exists(once):
            open(once, "a").close()  # the next boot finds it and serves
        elif not config.faults.crash_first_prefill:
            return
        logger.error("Scheduler hit an exception during the first prefill batch.")
        die(traceback_tail(SCHEDULER_FRAMES, "AssertionError: [sglang_sim fault crash_first_prefill] "
                                             "prefill batch failed: req.extend_input_len > 0"))
    return on_prefill


async def _start_site(app: web.Application, host: str, port: int, reuse_port: bool = False) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_SECONDS)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_port=reuse_port or None).start()
    return runner


async def _start_peer_site(state: ServerState, shard: Shard) -> web.AppRunner:
    runner = web.AppRunner(shard_peer_app(state), access_log=None)
    await runner.setup()
    await web.UnixSite(runner, shard.socket(shard.index)).start()
    return runner


async def _serve_rank0(args: ServerArgs, config: SimConfig, env: SglangEnv, architecture: str,
                       answer_key: GpqaAnswerKey, emission_log: EmissionLog | None, noise: BootNoise | None = None,
                       shard: Shard | None = None) -> int:
    """``shard``: this process is one of the server's shards (dspark_ci.sglang_sim.engine_shards), ``noise`` the boot's
    draws."""
    stop = _stop_on_signals()
    first = shard is None or shard.index == 0  # what the server does once, its first shard does
    if first:
        _arm_rank_exit(config, 0)
    shape = SpecShape.of(args)
    num_dp_ranks = args.num_dp_ranks
    metrics = (ServerMetrics(args, num_dp_ranks, native_api.startup_times(config.boot_seconds) if first else None,
                             pid=shard.server_pid if shard else None)
               if args.enable_metrics else None)
    noise = noise or BootNoise.of(config)
    if shard is not None:
        noise = noise.counting_requests_with(shard.counter("requests"))
    persona = Persona(config.seed, config.gpqa_accuracy, answer_key, garbage=config.faults.garbage_output,
                      concentration=config.gpqa_concentration, nonce=noise.nonce)
    engine = Engine(args, config, env, shape, persona, _crash_on_prefill(config), metrics, emission_log, noise,
                    owned=shard.owned_ranks(num_dp_ranks) if shard else None,
                    counters=shard.counter if shard else None)
    state = ServerState(args, config, engine, metrics, architecture, shard=shard)
    leader = Leader(args.nnodes, on_rank_lost=lambda rank: die(traceback_tail(SCHEDULER_FRAMES, (
        f"RuntimeError: NCCL communicator was aborted: node rank {rank} disconnected "
        "(sglang_sim: a peer rank exited)"))))
    if args.nnodes > 1:
        await leader.listen(*split_addr(args.dist_init_addr or f"{args.host}:20000"))
    pd = Disaggregation.of(args.disaggregation_mode, config.faults.names, config.prefill_ms_per_token, metrics)
    bootstrap = await _start_bootstrap(pd, args)
    peer = await _start_peer_site(state, shard) if shard is not None else None
    runner = await _start_site(api_app(state, [pd.middleware()] if pd else []), args.host, args.port,
                               reuse_port=shard is not None)
    if first:
        logger.info(f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
    booting = asyncio.create_task(_boot(state, config, leader, shape))
    await stop.wait()
    booting.cancel()
    await leader.close()
    await runner.cleanup()
    if peer is not None:
        await peer.cleanup()
    if bootstrap is not None:
        await bootstrap.cleanup()
    return 0


async def _start_bootstrap(pd: Disaggregation | None, args: ServerArgs) -> web.AppRunner | None:
    """A PD prefill's bootstrap server (--disaggregation-bootstrap-port, SGLang's default 8998)."""
    if pd is None or pd.mode != "prefill":
        return None
    port = int(args.other_flags.get("disaggregation_bootstrap_port") or 8998)
    logger.info(f"[PD prefill] bootstrap server on {args.host}:{port}")
    return await _start_site(pd.bootstrap_app(), args.host, port)


async def _boot(state: ServerState, config: SimConfig, leader: Leader, shape: SpecShape | None) -> None:
    args = state.args
    logger.info(f"Load weight begin. model_path={args.model_path}, architecture={state.architecture}")
    await asyncio.sleep(config.boot_seconds)
    if shape is not None:
        logger.info(f"Speculative decoding: algorithm={shape.algorithm}, "
                    f"num_draft_tokens={shape.num_draft_tokens}, accept_prob={config.accept_prob:g}")
    if not leader.everyone_joined.is_set():
        logger.info(f"Waiting for {len(leader.expected)} other node ranks to join at {args.dist_init_addr}.")
    await leader.everyone_joined.wait()
    if config.faults.hang_boot:
        logger.info("Capture cuda graph begin.")  # ... and never ends
        await asyncio.Event().wait()
    if not args.skip_server_warmup:
        await native_api.warm_up(state)
    if state.shard is not None:
        await state.shard.all_ready()  # /health says 200 for the whole server, whichever shard answers
    # What boot made lives as long as the server: out of the collector's reach. And a full collection walks every
    # live request's objects (~100k at 512 streams: a 50-150 ms stall of every stream's step), so it runs after
    # GC_FULL_EVERY younger collections, not 10: a request's objects die by reference count, young cycles in the
    # younger generations.
    gc.freeze()
    gc.set_threshold(*gc.get_threshold()[:2], GC_FULL_EVERY)
    state.ready = True
    if state.shard is None or state.shard.index == 0:
        logger.info("The server is fired up and ready to roll!")


async def _serve_other_rank(args: ServerArgs, config: SimConfig) -> int:
    stop = _stop_on_signals()
    _arm_rank_exit(config, args.node_rank)
    runner = await _start_site(dummy_health_app(), args.host, args.port)
    host, port = split_addr(args.dist_init_addr or "127.0.0.1:20000")
    try:
        reader, writer = await join(host, port, args.node_rank, config.join_timeout_seconds)
    except TimeoutError as err:
        die(traceback_tail(SCHEDULER_FRAMES, f"RuntimeError: {err}"))
    logger.info(f"Node rank {args.node_rank} joined rank 0 at {host}:{port}; serving a dummy /health.")
    leader_gone = asyncio.create_task(reader.read())
    stopped = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({leader_gone, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if leader_gone in done:
        die(traceback_tail(SCHEDULER_FRAMES, f"RuntimeError: NCCL communicator was aborted: lost node rank 0 "
                                             f"at {host}:{port} (sglang_sim: a peer rank exited)"))
    writer.close()
    await runner.cleanup()
    return 0
