"""SGLang's native endpoints (``srt/entrypoints/http_server.py``): health, info, /generate, cache, metrics."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from aiohttp import web
from dspark_ci.sglang_sim import logprobs, mc_logprobs, reply_faults
from dspark_ci.sglang_sim.args import SGLANG_VERSION
from dspark_ci.sglang_sim.choices import Choices
from dspark_ci.sglang_sim.engine import Generation, Job
from dspark_ci.sglang_sim.engine_shards import gathered, gathered_json, merge_expositions
from dspark_ci.sglang_sim.openai_api import BadRequest, error_response, parse_penalties
from dspark_ci.sglang_sim.prometheus import MAX_TOTAL_NUM_TOKENS
from dspark_ci.sglang_sim.server_state import ServerState, json_response, sse_event
from dspark_ci.sglang_sim.textgen import Ask
from dspark_ci.sglang_sim.tokenizer import count_tokens

logger = logging.getLogger("sglang_sim")
# http_server._execute_server_warmup: the request SGLang sends itself before /health says 200
WARMUP_PROMPT = "The capital city of France is"
WARMUP_MAX_NEW_TOKENS = 8
SHARD_STATES_PATH, SHARD_METRICS_PATH = "/shard/internal_states", "/shard/metrics"  # on a shard's peer socket
FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. "
           "(When there are running or waiting requests, the operation will not be performed.)\n")


def _state(request: web.Request) -> ServerState:
    return request.app[ServerState.KEY]


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200 if _state(request).ready else 503)


async def model_info(request: web.Request) -> web.Response:
    state = _state(request)
    args = state.args
    return json_response({
        "model_path": args.model_path, "served_model_name": args.model_name,
        "tokenizer_path": args.tokenizer_path or args.model_path, "is_generation": True,
        "preferred_sampling_params": None, "weight_version": "default", "load_format": "auto",
        "reasoning_parser": args.reasoning_parser, "tool_call_parser": None,
        "disaggregation_mode": args.disaggregation_mode, "has_image_understanding": False,
        "has_audio_understanding": False, "model_type": None, "architectures": [state.architecture],
    })


# ServerArgs fields of SGLang that no command-line flag sets, as /server_info reports them resolved
# (server_args.resolved_dict(); seen on the release's own front end, tests/test_frontend_conformance.py).
UNFLAGGED_FIELDS = {
    "_radix_eviction_policy_explicitly_set": False, "_speculative_draft_quantization_explicitly_set": False,
    "_swa_full_tokens_ratio_explicitly_set": True, "aux_hidden_state_capture": None,
    "custom_sigquit_handler": None, "enable_cp_tp_group_sharing": False, "grpc_worker_threads": 4,
    "speculative_boundary_reduction": "rs+rsv", "stat_loggers": None, "uses_mamba_radix_cache": False,
    "watermark_context_window": 4, "watermark_default_enabled": False, "watermark_enforce_all": False,
    "watermark_key": "<redacted>", "watermark_key_b": "<redacted>", "watermark_max_probability": 1.0,
    "watermark_mixing_probability": 0.5,
}
NOT_A_FIELD = ("config",)  # --config names a file of flags: parsed away, never a ServerArgs field
SCHEDULER_PHASES = ("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend")


def startup_times(boot_seconds: float) -> dict:
    """SGLang's startup_time record (engine._set_startup_time): the scheduler's phases, which the simulator
    spends no time in, and the whole boot as the tokenizer's."""
    return {"load_weight": 0.0, "kv_cache_allocation": 0.0, "scheduler_e2e": 0.0,
            "cuda_graph": {phase: 0.0 for phase in SCHEDULER_PHASES}, "tokenizer_e2e": boot_seconds}


def _scheduler_state(state: ServerState) -> dict:
    """What every internal_states entry adds to the server args (internal_state.SchedulerInternalStateController)."""
    memory = {"weight": 0.0, "kvcache": 0.0, "startup_available": 0.0, "token_capacity": MAX_TOTAL_NUM_TOKENS,
              "token_capacity_swa": None, "graph": {phase: 0.0 for phase in SCHEDULER_PHASES}}
    times = startup_times(state.config.boot_seconds)
    times.pop("tokenizer_e2e")
    return {"startup_time": times, "memory_usage": memory}


def _server_args(state: ServerState) -> dict:
    server_args = {name: value for name, value in state.args.to_dict().items() if name not in NOT_A_FIELD}
    server_args.update(UNFLAGGED_FIELDS)
    return server_args


def _rank_states(state: ServerState) -> list[list]:
    """[DP rank, internal_states entry] of each rank this process schedules."""
    entries = state.engine.internal_states(_server_args(state))
    return [[rank.dp_rank, entry] for rank, entry in zip(state.engine.owned, entries, strict=False)]


async def server_info(request: web.Request) -> web.Response:
    state = _state(request)
    server_args = _server_args(state)
    scheduler_info = {"status": "ready", "max_total_num_tokens": MAX_TOTAL_NUM_TOKENS,
                      "max_req_input_len": state.context_length - 1, "hicache_object_layout": None}
    answers = await gathered_json(_rank_states(state), state.shard, SHARD_STATES_PATH)  # every shard's ranks
    ranked = sorted((pair for answer in answers for pair in answer), key=lambda pair: pair[0])
    # SGLang drops the signal handler from each entry (not serialisable over its IPC).
    internal_states = [{**{k: v for k, v in entry.items() if k != "custom_sigquit_handler"}, **_scheduler_state(state)}
                       for _, entry in ranked]
    return json_response({**server_args, "launch_command": state.args.launch_command, **scheduler_info,
                          "kv_events": None, "startup_time": startup_times(state.config.boot_seconds),
                          "internal_states": internal_states, "version": str(state.config.version or SGLANG_VERSION),
                          "frontend": "python"})


async def shard_states(request: web.Request) -> web.Response:
    """A sibling shard asks for this shard's ranks (dspark_ci.sglang_sim.engine_shards)."""
    return json_response(_rank_states(_state(request)))


async def shard_metrics(request: web.Request) -> web.Response:
    """A sibling shard asks for this shard's own /metrics."""
    metrics = _state(request).metrics
    return web.Response(body=metrics.render() if metrics is not None else b"")


async def deprecated(request: web.Request, name: str, handler) -> web.Response:
    logger.warning(f"Endpoint '/get_{name}' is deprecated and will be removed in a future version. "
                   f"Please use '/{name}' instead.")
    return await handler(request)


async def get_model_info(request: web.Request) -> web.Response:
    return await deprecated(request, "model_info", model_info)


async def get_server_info(request: web.Request) -> web.Response:
    return await deprecated(request, "server_info", server_info)


async def models(request: web.Request) -> web.Response:
    state = _state(request)
    name = state.args.model_name
    return json_response({"object": "list", "data": [{
        "id": name, "object": "model", "created": int(state.startup_time), "owned_by": "sglang", "root": name,
        "parent": None, "max_model_len": state.context_length}]})


async def flush_cache(request: web.Request) -> web.Response:
    return web.Response(text=FLUSHED)


async def metrics(request: web.Request) -> web.Response:
    metrics = _state(request).metrics
    if metrics is None:  # SGLang serves /metrics only with --enable-metrics
        raise web.HTTPNotFound()
    state = _state(request)
    body = metrics.render()
    if state.shard is not None:  # the server's figures: every shard's series added up
        body = merge_expositions(await gathered(body, state.shard, SHARD_METRICS_PATH))
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


# --- /generate -------------------------------------------------------------------------------

def _generate_jobs(state: ServerState, body: dict) -> tuple[list[Job], bool]:
    text = body.get("text")
    if isinstance(text, str):
        prompts, batched = [text], False
    elif isinstance(text, list) and text and all(isinstance(item, str) for item in text):
        prompts, batched = text, True
    else:
        raise BadRequest("text must be a string or a non-empty list of strings")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object")
    max_new_tokens = params.get("max_new_tokens", 128)
    temperature = params.get("temperature", 1.0)
    stream = bool(body.get("stream", False))
    jobs = []
    for prompt in prompts:
        prompt_tokens = count_tokens(prompt)
        ask = Ask(prompt, prompt, state.engine.sample_key(temperature, params.get("top_k"), params.get("top_p"),
                                                      params.get("sampling_seed")), False,
                  bool(params.get("ignore_eos")), parse_penalties(params))
        jobs.append(Job(ask, prompt_tokens, int(state.max_new_tokens(prompt_tokens, max_new_tokens)), stream,
                        temperature=float(temperature or 0)))
    return jobs, batched


def _output(gen: Generation, index: int | None) -> dict:
    out: dict[str, Any] = {"text": gen.text, "output_ids": gen.output_ids(),
           "meta_info": gen.meta_info()}
    if index is not None:
        out["index"] = index
    return out


async def generate(request: web.Request) -> web.StreamResponse:
    state = _state(request)
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        jobs, batched = _generate_jobs(state, body)
    except (BadRequest, json.JSONDecodeError, UnicodeDecodeError) as err:
        return json_response({"error": {"message": str(err)}}, status=400)
    choices = Choices(state.engine, jobs)
    if not jobs[0].streaming:
        generations = await choices.run_to_end()
        outputs = [_output(gen, None) for gen in generations]
        for index, (output, job) in enumerate(zip(outputs, jobs, strict=False)):  # faults of non-streamed replies only
            output["text"] = reply_faults.text(state.config.faults, output["text"])
            mc_logprobs.attach(state.config, body, job.ask.prompt, index, output["meta_info"])
        if body.get("return_logprob"):  # tokenizer_manager.add_logprob_to_meta_info (sglang_sim/logprobs.py)
            for output, gen, job in zip(outputs, generations, jobs, strict=False):
                output["meta_info"].update(logprobs.meta_info_fields(
                    state.engine.persona, job.ask, gen.tokens, state.config.faults,
                    int(body.get("top_logprobs_num") or 0), bool(body.get("return_text_in_logprobs"))))
        return json_response(outputs if batched else outputs[0])
    response = await state.open_stream(request)
    async with state.streaming(request, response) as send, choices.stepping() as steps:
        async for index, _ in steps:
            # SGLang streams the text so far (incremental_streaming_output is off by default)
            await send(sse_event(_output(choices.generations[index], index if batched else None)))
        await send(b"data: [DONE]\n\n", last=True)
    return response


async def warm_up(state: ServerState) -> None:
    """SGLang's startup warmup (unless --skip-server-warmup): one greedy /generate of 8 tokens, one prompt per
    DP rank. It goes through the engine like any request, so the /metrics counters exist (and count it) by the
    time the server is healthy; a labelled counter appears only once a request has moved it."""
    ranks = len(state.engine.owned)  # a shard warms up its own ranks
    body = {"text": WARMUP_PROMPT if ranks == 1 else [WARMUP_PROMPT] * ranks,
            "sampling_params": {"temperature": 0, "max_new_tokens": WARMUP_MAX_NEW_TOKENS}}
    jobs, _ = _generate_jobs(state, body)
    await Choices(state.engine, [dataclasses.replace(job, warmup=True) for job in jobs]).run_to_end()


def not_ready(handler):
    """Generation endpoints answer 503 until the server is up (the engine is not there yet)."""
    async def guarded(request: web.Request) -> web.StreamResponse:
        if not _state(request).ready:
            return error_response("The server is not ready yet.", status=503, err_type="ServiceUnavailable")
        return await handler(request)
    return guarded
