"""The scheduler process of ``--server sglang-frontend``: the simulator's engine behind SGLang's own IPC.

SGLang's ``launch_server`` spawns this in place of ``run_scheduler_process`` (same arguments). It binds SGLang's
sockets (``PortArgs``) as SGLang's scheduler does (``scheduler_components/ipc_channels.py``), answers the startup
handshake on ``pipe_writer``, and then serves the messages of ``managers/io_struct.py``:

- ``TokenizedGenerateReqInput`` (and the batched form): one engine run per request (``dspark_ci.sglang_sim.engine``: the
  same ``DSPARK_SIM_*`` timing, speculative acceptance, GPQA answers and faults as the simulator), each step sent
  to the DetokenizerManager as a ``BatchTokenIDOutput`` built as ``output_streamer.py`` builds it: ``output_ids``
  as deltas, ``decode_ids``/``read_offsets`` as ``Req.init_incremental_detokenize`` computes them, token counts,
  SGLang's finish reasons, ``spec_verify_ct`` / ``spec_num_correct_drafts`` / the acceptance histogram, the
  request's time stats (meta_info's timestamps) and its DP rank;
- ``AbortReq``: the run stops with ``FINISH_ABORT`` (``{"type": "abort", "message": "Aborted", ...}``), a queued
  one is answered with an ``AbortReq`` to the TokenizerManager, as ``Scheduler.abort_request`` does;
- ``GetInternalStateReq``: SGLang's own ``SchedulerInternalStateController`` over this scheduler
  (``/server_info``'s ``internal_states``, ``avg_spec_accept_length`` included);
- ``FlushCacheReqInput``, sessions, pause/continue, profile, weights and the other control requests: answered
  with their ``...Output`` the way a scheduler without that feature answers (``CONTROL_REPLIES``).

Requests that are not a client's (SGLang's startup warmup, ``/health`` generations, rid ``HEALTH_CHECK_...``)
run as the simulator's warmup does: no crash_first_prefill, no emission log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import traceback
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import zmq
import zmq.asyncio
from dspark_ci.sglang_sim import logprobs
from dspark_ci.sglang_sim.admission import SglangEnv
from dspark_ci.sglang_sim.emission_log import EmissionLog
from dspark_ci.sglang_sim.engine import Engine, Generation, Job
from dspark_ci.sglang_sim.failures import SCHEDULER_FRAMES, print_lines, traceback_tail
from dspark_ci.sglang_sim.frontend.launch import MODEL_DIR_ENV, admitted
from dspark_ci.sglang_sim.frontend.vocab import Vocabulary
from dspark_ci.sglang_sim.gpqa_answers import GpqaAnswerKey
from dspark_ci.sglang_sim.native_api import WARMUP_MAX_NEW_TOKENS, WARMUP_PROMPT
from dspark_ci.sglang_sim.noise import BootNoise
from dspark_ci.sglang_sim.prometheus import MAX_TOTAL_NUM_TOKENS, kv_gauges
from dspark_ci.sglang_sim.sim_config import SimConfig
from dspark_ci.sglang_sim.speculation import SpecShape
from dspark_ci.sglang_sim.textgen import Ask, Penalties, Persona

logger = logging.getLogger("sglang_sim")
HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK"  # sglang/srt/constants.py
INIT_INCREMENTAL_DETOKENIZATION_OFFSET = 5  # schedule_batch.py: prompt ids sent along for the first decode
USER_TURN, ASSISTANT_TURN = "<|user|>\n", "\n<|assistant|>\n"
GREEDY_BELOW = 1e-6  # sampling_params._SAMPLING_EPS
ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}  # FINISH_ABORT().to_json()


def question_of(prompt: str) -> str:
    """The last user turn of a prompt our chat template rendered (where a GPQA question is), else the prompt."""
    start = prompt.rfind(USER_TURN)
    if start < 0:
        return prompt
    body = prompt[start + len(USER_TURN):]
    end = body.rfind(ASSISTANT_TURN)
    return body[:end] if end >= 0 else body


@dataclass
class Running:
    """One request in flight: what SGLang's Req keeps for streaming it (schedule_batch.Req)."""

    req: Any  # TokenizedGenerateReqInput
    gen: Generation
    prompt_ids: list[int]
    time_stats: Any  # SchedulerReqTimeStats
    output_ids: list[int] = field(default_factory=list)
    sent_output: int = 0  # req.send_token_offset
    sent_decode: int = 0  # req.send_decode_id_offset
    task: asyncio.Task | None = None
    # with return_logprob, per output id: (logprob, [(top logprob, top id), ...]) (sglang_sim/logprobs.py)
    logprob_rows: list[tuple[float, list[tuple[float, int]]]] = field(default_factory=list)
    logprob_pieces: int = 0  # engine tokens whose rows are in logprob_rows

    def decode_ids(self) -> tuple[list[int], int]:
        """Req.init_incremental_detokenize: the prompt's last ids, then every output id; and the read offset."""
        surr = max(len(self.prompt_ids) - INIT_INCREMENTAL_DETOKENIZATION_OFFSET, 0)
        return self.prompt_ids[surr:] + self.output_ids, len(self.prompt_ids) - surr


class StandIn:
    """The simulated scheduler: the engine, SGLang's sockets, and the bookkeeping SGLang's scheduler reports."""

    def __init__(self, server_args, port_args, vocabulary: Vocabulary):
        from sglang.srt.managers import io_struct
        from sglang.srt.utils.network import get_zmq_socket

        self.io = io_struct
        self.vocabulary = vocabulary
        self.server_args = server_args
        self.config = SimConfig.from_env(os.environ)
        env = SglangEnv.from_environ(os.environ)
        self.args, _ = admitted()
        noise = BootNoise.of(self.config)  # as the simulator's rank 0 builds its engine (dspark_ci.sglang_sim.main)
        persona = Persona(self.config.seed, self.config.gpqa_accuracy, GpqaAnswerKey.load(self.config.gpqa_path),
                          garbage=self.config.faults.garbage_output, concentration=self.config.gpqa_concentration,
                          nonce=noise.nonce)
        log = self.config.emission_log
        self.emission_log = EmissionLog.open(log) if log is not None else None
        self.shape = SpecShape.of(self.args)
        self.collector = _scheduler_metrics_collector(server_args)
        gauges = SchedulerGauges(self.collector) if self.collector is not None else None
        self.engine = Engine(self.args, self.config, env, self.shape, persona, self._crash_on_prefill,
                             metrics=cast(Any, gauges), emission_log=self.emission_log,  # ServerMetrics' hooks
                             noise=noise)
        if gauges is not None:
            gauges.engine = self.engine
        self.context = zmq.asyncio.Context(2)
        self.recv_from_tokenizer = get_zmq_socket(self.context, zmq.PULL, port_args.scheduler_input_ipc_name, False)
        self.recv_from_rpc = get_zmq_socket(self.context, zmq.DEALER, port_args.rpc_ipc_name, False)
        self.send_to_tokenizer = get_zmq_socket(self.context, zmq.PUSH, port_args.tokenizer_ipc_name, False)
        self.send_to_detokenizer = get_zmq_socket(self.context, zmq.PUSH, port_args.detokenizer_ipc_name, False)
        self.running: dict[str, Running] = {}
        self.clients_seen = False
        self.startup_time = {"load_weight": 0.0, "kv_cache_allocation": 0.0, "scheduler_e2e": 0.0,
                             "cuda_graph": {}}
        self.context_length = server_args.context_length or 32768

    # --- the startup handshake -----------------------------------------------------------------

    def init_info(self) -> dict:
        """Scheduler.get_init_info: what the TokenizerManager waits for before serving."""
        return {"status": "ready", "max_total_num_tokens": MAX_TOTAL_NUM_TOKENS,
                "max_req_input_len": self.context_length - 1,
                "startup_time": self.startup_time, "hicache_object_layout": None}

    # --- faults, as the simulator's rank 0 has them (dspark_ci.sglang_sim.main) ----------------------------

    def _crash_on_prefill(self) -> None:
        if self.config.faults.crash_first_prefill:
            logger.error("Scheduler hit an exception during the first prefill batch.")
            self.die(traceback_tail(SCHEDULER_FRAMES, "AssertionError: [sglang_sim fault crash_first_prefill] "
                                                      "prefill batch failed: req.extend_input_len > 0"))

    @staticmethod
    def die(lines: list[str]) -> None:
        """What SGLang's scheduler does on an exception: log it, SIGQUIT the launching process (which tears the
        whole server down, sigquit_handler), exit."""
        print_lines(lines)
        with contextlib.suppress(ProcessLookupError):
            os.kill(os.getppid(), signal.SIGQUIT)
        os._exit(1)

    # --- requests --------------------------------------------------------------------------------

    def _job(self, req, prompt_ids: list[int]) -> Job:
        params = req.sampling_params
        prompt = req.input_text if isinstance(req.input_text, str) else self.vocabulary.text(prompt_ids)
        internal = (req.rid or "").startswith(HEALTH_CHECK_RID_PREFIX) or (
            not self.clients_seen and prompt == WARMUP_PROMPT and params.max_new_tokens == WARMUP_MAX_NEW_TOKENS)
        self.clients_seen |= not internal
        limit = params.max_new_tokens
        if limit is None:
            limit = max(1, self.context_length - len(prompt_ids))
        # SamplingParams.normalize turns temperature 0 into temperature 1 with top_k 1: greedy either way.
        greedy = params.top_k == 1 or (params.temperature is not None and params.temperature < GREEDY_BELOW)
        temperature = 0.0 if greedy else (params.temperature or 1.0)
        # SGLang's chat layer decided whether the model reasons (its reasoning parser's rule): it thinks then.
        thinking = bool(req.require_reasoning)
        penalties = Penalties(params.frequency_penalty, params.presence_penalty, params.repetition_penalty)
        ask = Ask(prompt, question_of(prompt), self.engine.sample_key(temperature, top_p=params.top_p,
                                                                        seed=params.sampling_seed), thinking,
                  bool(params.ignore_eos), penalties)
        return Job(ask, len(prompt_ids), int(limit), bool(req.stream), require_reasoning=thinking, warmup=internal,
                   temperature=temperature)

    def _time_stats(self, req) -> Any:
        """SchedulerReqTimeStats as Req.__init__ makes it from the TokenizerManager's (meta_info's timestamps)."""
        from sglang.srt.managers.io_struct import unwrap_from_pickle
        from sglang.srt.observability.req_time_stats import SchedulerReqTimeStats

        received = unwrap_from_pickle(req.time_stats) if req.time_stats is not None else None
        stats = SchedulerReqTimeStats.new_from_obj(received)
        stats.set_metrics_collector(self.collector)
        stats.set_scheduler_recv_time()
        stats.set_wait_queue_entry_time()
        return stats

    def generate(self, req) -> None:
        prompt_ids = list(req.input_ids or [])
        job = self._job(req, prompt_ids)
        gen = self.engine.start(job)
        gen.rid = req.rid
        stats = self._time_stats(req)
        running = Running(req, gen, prompt_ids, stats)
        self.running[req.rid] = running
        running.task = asyncio.create_task(self._run(running, job))

    async def _run(self, running: Running, job: Job) -> None:
        try:
            async with contextlib.aclosing(self.engine.run(running.gen, job)) as steps:
                async for tokens in steps:
                    for piece in tokens:
                        running.output_ids.extend(self.vocabulary.ids(piece))
                    if running.req.return_logprob:
                        self._logprob_rows(running, job)
                    await self._send(running)
        except asyncio.CancelledError:
            pass
        finally:
            self.running.pop(running.req.rid, None)

    def _logprob_rows(self, running: Running, job: Job) -> None:
        """The new engine tokens' logprobs as rows per output id: a token of several ids carries its logprob on the
        first (the rest are certain given it), the top candidates each by their first id."""
        top = int(running.req.top_logprobs_num or 0)
        rows = logprobs.positions(self.engine.persona, job.ask, running.gen.tokens, self.config.faults)
        for taken, table in rows[running.logprob_pieces:]:
            ids = self.vocabulary.ids(taken.piece)
            candidates = [(c.logprob, self.vocabulary.ids(c.piece)[0]) for c in table[:top]]
            running.logprob_rows.append((taken.logprob, candidates))
            running.logprob_rows.extend((0.0, [(0.0, token)][:top]) for token in ids[1:])
        running.logprob_pieces = len(rows)

    async def _send(self, running: Running, finish: dict | None = None) -> None:
        stats = running.time_stats
        if running.gen.first_token is not None and not stats.forward_entry_time:
            stats.set_forward_entry_time()
            stats.set_prefill_finished_time()
        if (finish or running.gen.finish_reason) is not None:
            stats.set_completion_time()
        await self.io.async_sock_send(self.send_to_detokenizer, token_output(self.io, running, finish))

    async def abort(self, req) -> None:
        """Scheduler.abort_request: a running request ends with FINISH_ABORT on its next step, a queued one is
        answered with an AbortReq to the TokenizerManager."""
        targets = [r for rid, r in self.running.items() if req.abort_all or rid.startswith(req.rid or "\0")]
        for running in targets:
            finish = dict(req.finished_reason) if req.finished_reason else dict(ABORTED)
            running.gen.finish_reason = finish
            if running.task is not None:
                running.task.cancel()
            if running.gen.first_token is None:
                await self.io.async_sock_send(self.send_to_tokenizer, self.io.AbortReq(
                    rid=running.req.rid, finished_reason=finish, http_worker_ipc=running.req.http_worker_ipc))
            else:
                await self._send(running, finish)

    # --- control requests ------------------------------------------------------------------------

    def internal_states(self) -> list[Any]:
        """One GetInternalStateReqOutput per DP rank of the engine, in rank order, each from SGLang's own
        controller over that rank's figures: what SGLang's DP schedulers answer (the TokenizerManager waits for
        as many, ``launch.wait_for_every_dp_rank``)."""
        return [self._internal_state(rank) for rank in self.engine.ranks]

    def _internal_state(self, rank) -> Any:
        from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController

        shape = self.shape
        algorithm = shape.algorithm if shape is not None else None
        records = list(rank.dspark_records)
        draft_worker = SimpleNamespace(graph_memory_usage={}, dump_info_records=lambda: {
            "mode": self.engine.env.ragged_verify_mode, "gamma": shape.drafts_per_step,
            "verify_num_draft_tokens": shape.num_draft_tokens, "components": ["core"],
            "records": records, "simulate_acc_len": None}) if shape is not None and algorithm == "DSPARK" else None
        dspark = draft_worker is not None
        scheduler = SimpleNamespace(
            startup_time=self.startup_time, max_running_requests=self.args.max_running_requests,
            metrics_reporter=SimpleNamespace(last_gen_throughput=rank.last_gen_throughput,
                                             spec_total_num_forward_ct=rank.total_forward_ct,
                                             spec_total_num_accept_tokens=rank.total_accept_tokens),
            draft_worker=draft_worker,
            tp_worker=SimpleNamespace(model_runner=SimpleNamespace(weight_load_mem_usage=0.0),
                                      graph_memory_usage={}, get_decode_cuda_graph_bs=lambda: []),
            token_to_kv_pool_allocator=SimpleNamespace(get_kvcache=lambda: SimpleNamespace(mem_usage=0.0)),
            startup_available_gpu_memory_gb=0.0, max_total_num_tokens=MAX_TOTAL_NUM_TOKENS, swa_tokens_per_layer=None,
            spec_algorithm=SimpleNamespace(is_none=lambda: self.shape is None, is_dspark=lambda: dspark,
                                           is_dflash=lambda: algorithm == "DFLASH"),
            rust_server=None)
        output = SchedulerInternalStateController(scheduler, record_step_time=False).get_internal_state(
            self.io.GetInternalStateReq())
        output.internal_state.update(num_running_reqs=rank.running, num_queue_reqs=rank.queued)
        return output

    def control_reply(self, request) -> Any:
        io = self.io
        replies = {
            io.GetInternalStateReq: self.internal_states,
            io.FlushCacheReqInput: lambda: io.FlushCacheReqOutput(success=not self.running),
            io.SetInternalStateReq: lambda: io.SetInternalStateReqOutput(updated=False),
            io.FreezeGCReq: lambda: None,
        }
        for kind, reply in replies.items():
            if isinstance(request, kind):
                return reply()
        logger.warning(f"[sglang_sim frontend] scheduler stand-in ignores {type(request).__name__}")
        return None

    async def dispatch(self, request) -> None:
        io = self.io
        if isinstance(request, io.TokenizedGenerateReqInput):
            self.generate(request)
        elif isinstance(request, io.BatchTokenizedGenerateReqInput):
            for item in request.batch:
                self.generate(item)
        elif isinstance(request, io.AbortReq):
            await self.abort(request)
        else:
            reply = self.control_reply(request)
            for each in reply if isinstance(reply, list) else [reply] if reply is not None else []:
                if getattr(each, "http_worker_ipc", None) is None and hasattr(each, "http_worker_ipc"):
                    each.http_worker_ipc = getattr(request, "http_worker_ipc", None)
                await io.async_sock_send(self.send_to_tokenizer, each)

    async def serve(self, pipe_writer) -> int:
        # Node ranks >= 1 have joined already (launch.gather_node_ranks, before SGLang started this process).
        await asyncio.sleep(self.config.boot_seconds)
        if self.config.faults.hang_boot:
            logger.info("Capture cuda graph begin.")  # ... and never ends: the front end never says ready
            await asyncio.Event().wait()
        pipe_writer.send(self.init_info())
        logger.info("[sglang_sim frontend] scheduler stand-in ready")
        while True:
            request = await self.io.async_sock_recv(self.recv_from_tokenizer)
            await self.dispatch(request)


def _output_logprobs(running: Running) -> dict:
    """BatchTokenIDOutput's output logprob fields for this step's ids: one list per request when it asked for
    logprobs (the TokenizerManager indexes them then), else empty."""
    if not running.req.return_logprob:
        return {"output_token_logprobs_val": [], "output_token_logprobs_idx": [], "output_top_logprobs_val": [],
                "output_top_logprobs_idx": []}
    rows = running.logprob_rows[running.sent_output:len(running.output_ids)]
    ids = running.output_ids[running.sent_output:]
    return {"output_token_logprobs_val": [[value for value, _ in rows]], "output_token_logprobs_idx": [ids[:len(rows)]],
            "output_top_logprobs_val": [[[v for v, _ in top] for _, top in rows]],
            "output_top_logprobs_idx": [[[i for _, i in top] for _, top in rows]]}


def token_output(io, running: Running, finish: dict | None = None) -> Any:
    """The BatchTokenIDOutput of one request's new step, as output_streamer.py builds it (marks it sent)."""
    gen, req = running.gen, running.req
    params = req.sampling_params
    decode_ids, read_offset = running.decode_ids()
    spec = gen.spec
    finished = finish or gen.finish_reason
    histogram = list(spec.histogram) if spec is not None else []
    output = io.BatchTokenIDOutput(
        rids=[req.rid], http_worker_ipcs=[req.http_worker_ipc], finished_reasons=[finished],
        decoded_texts=[""], decode_ids=[array("i", decode_ids[running.sent_decode:])],
        read_offsets=[read_offset], output_ids=[array("i", running.output_ids[running.sent_output:])],
        skip_special_tokens=[params.skip_special_tokens],
        spaces_between_special_tokens=[params.spaces_between_special_tokens],
        no_stop_trim=[params.no_stop_trim], prompt_tokens=[len(running.prompt_ids)],
        reasoning_tokens=[gen.reasoning.tokens],
        completion_tokens=[gen.completion_tokens], cached_tokens=[0],
        input_token_logprobs_val=[], input_token_logprobs_idx=[], input_top_logprobs_val=[],
        input_top_logprobs_idx=[], **_output_logprobs(running), input_token_ids_logprobs_val=[],
        input_token_ids_logprobs_idx=[], output_token_ids_logprobs_val=[], output_token_ids_logprobs_idx=[],
        output_token_entropy_val=None, output_token_sampling_mask=None, output_hidden_states=[],
        routed_experts=None, indexer_topk=None, placeholder_tokens_idx=None, placeholder_tokens_val=None,
        retraction_counts=[0],
        spec_verify_ct=[spec.verify_ct] if spec is not None else None,
        spec_num_correct_drafts=[spec.correct_drafts] if spec is not None else None,
        spec_num_block_accept_tokens=[0] if spec is not None else None,
        spec_num_cap_tokens=[0] if spec is not None else None,
        spec_correct_drafts_histogram=[histogram] if spec is not None else None,
        spec_cap_lens_histogram=[[]] if spec is not None else None,
        time_stats=io.wrap_as_pickle([running.time_stats]),
        dp_ranks=[gen.reported_dp_rank])
    running.sent_output, running.sent_decode = len(running.output_ids), len(decode_ids)
    return output


def _scheduler_metrics_collector(server_args) -> Any:
    """SGLang's own scheduler-side collector (SchedulerMetricsCollector.init_new), with --enable-metrics: it
    writes to the multiprocess directory the front end's /metrics reads, as a real scheduler does."""
    from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector

    return SchedulerMetricsCollector.init_new(server_args=server_args, enable_priority_scheduling=False,
                                              enable_lora=False, enable_hierarchical_cache=False).collector


class SchedulerGauges:
    """The engine's metrics hooks (as ``dspark_ci.sglang_sim.prometheus.ServerMetrics`` has them) feeding SGLang's
    SchedulerMetricsCollector.log_stats, as the scheduler's metrics_reporter does per logged batch."""

    def __init__(self, collector):
        self.collector = collector
        self.engine: Engine | None = None
        self.spec = (0.0, 0.0)

    def _log(self) -> None:
        from sglang.srt.observability.metrics_collector import QueueCount, SchedulerStats

        ranks = self.engine.ranks if self.engine is not None else []
        running, queued = sum(r.running for r in ranks), sum(r.queued for r in ranks)
        self.collector.log_stats(SchedulerStats(
            num_running_reqs=QueueCount(total=running), num_queue_reqs=QueueCount(total=queued),
            gen_throughput=sum(r.last_gen_throughput for r in ranks), spec_accept_length=self.spec[0],
            spec_accept_rate=self.spec[1], **kv_gauges(sum(r.used_tokens for r in ranks))))

    def scheduler_changed(self, rank) -> None:
        self._log()

    def spec_window(self, dp_rank: int, accept_length: float, accept_rate: float) -> None:
        self.spec = (accept_length, accept_rate)
        self._log()

    def request_finished(self, gen, streaming: bool) -> None:
        """The TokenizerManager counts finished requests itself (its own collector)."""


def run_scheduler_process(server_args, port_args, gpu_id, tp_rank, pp_rank, dp_rank, pipe_writer, *args, **kwargs):
    """In place of sglang.srt.managers.scheduler.run_scheduler_process (same signature)."""
    from sglang.srt.managers.scheduler import resolve_spawn_dp_rank
    from sglang.srt.runtime_context import SpawnRanks, get_serving, publish, spawn_world_rank

    # As run_scheduler_process publishes: the rank bundle SGLang's metrics and parallel state read.
    world_rank = spawn_world_rank(server_args, tp_rank=tp_rank, pp_rank=pp_rank)
    publish(server_args, role="scheduler",
            ranks=SpawnRanks(world_rank=world_rank, dp_rank=resolve_spawn_dp_rank(dp_rank), gpu_id=gpu_id))
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        force=True)
    tokenizer_path = server_args.tokenizer_path or get_serving().tokenizer_path or os.environ[MODEL_DIR_ENV]
    stand_in = StandIn(server_args, port_args, Vocabulary.read(Path(tokenizer_path)))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    try:
        sys.exit(asyncio.run(stand_in.serve(pipe_writer)))
    except Exception:  # as run_scheduler_process: log it, SIGQUIT the launching process (it tears all down)
        stand_in.die(["Scheduler hit an exception: " + traceback.format_exc()])
    finally:
        if stand_in.emission_log is not None:
            stand_in.emission_log.close()
