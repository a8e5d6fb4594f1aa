"""``/v1/chat/completions`` and ``/v1/completions`` with SGLang's JSON shapes.

Shapes follow ``srt/entrypoints/openai/protocol.py``, ``serving_chat.py``, ``serving_completions.py``
and ``sse_utils.py``: a chat stream is a role chunk, content (or reasoning) chunks, one finish
chunk per choice, then ``sglext`` in a chunk of its own, then usage, then ``[DONE]``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from dspark_ci.sglang_sim import logprobs, reply_faults
from dspark_ci.sglang_sim.args import ServerArgs
from dspark_ci.sglang_sim.choices import Choices
from dspark_ci.sglang_sim.engine import Generation, Job
from dspark_ci.sglang_sim.reasoning import ReasoningCount, reasoning_requested, separates_reasoning
from dspark_ci.sglang_sim.server_state import ServerState, json_response, sse_event
from dspark_ci.sglang_sim.textgen import Ask, Penalties
from dspark_ci.sglang_sim.tokenizer import THINK_END, THINK_START, count_tokens, encode, token_id

DEFAULT_MODEL_NAME = "default"
SPEC_DETAIL_FIELDS = {  # SpecTokensDetails, in its field order, with its defaults
    "spec_accept_rate": 0.0, "spec_accept_length": 0.0, "spec_cap_length": 0.0, "spec_block_accept_length": 0.0,
    "spec_num_correct_drafts": 0, "spec_num_proposed_drafts": 0, "spec_verify_ct": 0,
    "spec_correct_drafts_histogram": [], "spec_cap_lens_histogram": [],
}


class BadRequest(ValueError):
    """A request SGLang answers with 400 and an ErrorResponse.

    ``err_type`` tells SGLang's two paths apart (serving_base.handle_request): "BadRequestError" from
    request validation, "BadRequest" from a ValueError raised while converting the request."""

    def __init__(self, message: str, err_type: str = "BadRequestError"):
        super().__init__(message)
        self.err_type = err_type


def error_response(message: str, status: int = 400, err_type: str = "BadRequestError") -> web.Response:
    return json_response({"object": "error", "message": message, "type": err_type, "param": None, "code": status},
                         status=status)


@dataclass(frozen=True)
class Sampling:
    """What the OpenAI request asks of generation, validated."""

    model: str
    n: int
    max_tokens: int | None
    temperature: float
    top_k: int | None  # 1 leaves only the argmax: greedy
    top_p: float | None  # at or below the argmax's probability: greedy too (Engine.sample_key)
    penalties: Penalties  # frequency, presence and repetition penalties (dspark_ci.sglang_sim.textgen)
    ignore_eos: bool
    stream: bool
    include_usage: bool  # the usage chunk at the end
    continuous_usage: bool  # stream_options.continuous_usage_stats: usage on every content chunk too
    spec_details: bool
    seed: int | None = None  # names the sample (Engine.sample_key)


# What serving_chat.OpenAIServingChat._convert_to_internal_request refuses on a stream, in its order
CHAT_STREAM_REFUSES = {
    "return_prompt_token_ids": "return_prompt_token_ids is not supported with streaming. "
                               "Please set stream=false when using return_prompt_token_ids=true.",
    "return_token_ids": "return_token_ids is not supported with streaming on /v1/chat/completions. "
                        "Please set stream=false when using return_token_ids=true.",
    "return_meta_info": "return_meta_info is not supported with streaming. "
                        "Please set stream=false when using return_meta_info=true.",
}


@dataclass(frozen=True)
class ChatReturns:
    """What a chat request asks to get back beyond the text (ChatCompletionRequest's return_* fields,
    read as serving_chat._build_chat_response and _handle_streaming_request read them)."""

    meta_info: bool  # choices[].meta_info: the whole meta_info of each sample
    prompt_token_ids: bool  # choices[].prompt_token_ids: return_prompt_token_ids or return_token_ids
    response_token_ids: bool  # choices[].response_token_ids: return_token_ids
    input_ids_in_sglext: bool  # sglext.input_ids (streaming too)
    output_ids_in_sglext: bool  # sglext.output_ids, one list per choice (streaming too)

    @classmethod
    def parse(cls, body: dict, headers: Mapping[str, str], args: ServerArgs, streaming: bool) -> ChatReturns:
        if streaming:
            for flag, message in CHAT_STREAM_REFUSES.items():
                if body.get(flag):
                    raise BadRequest(message, "BadRequest")  # a ValueError in SGLang: type "BadRequest"
        token_ids = bool(body.get("return_token_ids"))
        # _should_return_input_ids / _should_return_output_ids: the body flag, a header, or the server flag
        return cls(meta_info=bool(body.get("return_meta_info")),
                   prompt_token_ids=token_ids or bool(body.get("return_prompt_token_ids")),
                   response_token_ids=token_ids,
                   input_ids_in_sglext=bool(body.get("return_input_ids_in_sglext"))
                   or headers.get("x-sglext-return-input-ids") == "1" or args.return_input_ids,
                   output_ids_in_sglext=bool(body.get("return_output_ids_in_sglext"))
                   or headers.get("x-sglext-return-output-ids") == "1" or args.return_output_ids)

    def sglext_ids(self, choices: Choices) -> dict:
        """sglext's input_ids (the prompt all choices share) and output_ids, as far as asked for."""
        ids: dict[str, Any] = {}
        if self.input_ids_in_sglext:
            ids["input_ids"] = encode(choices.jobs[0].ask.prompt)
        if self.output_ids_in_sglext:
            ids["output_ids"] = [list(gen.output_ids()) for gen in choices.generations]
        return ids


def _number(body: dict, key: str, default, kind=float):
    value = body.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise BadRequest(f"{key} must be a {'integer' if kind is int else 'number'}, got {value!r}")
    return kind(value)


def parse_sampling(body: dict, state: ServerState, default_max_tokens: int | None) -> Sampling:
    n = _number(body, "n", 1, int)
    if n < 1:
        raise BadRequest("n must be at least 1")
    max_tokens = _number(body, "max_completion_tokens", None, int) or _number(body, "max_tokens", default_max_tokens,
                                                                               int)
    if max_tokens is not None and max_tokens <= 0:
        raise BadRequest("max_tokens must be positive")
    temperature = _number(body, "temperature", None)
    # openai/utils.py should_include_usage: the server default only turns the final usage chunk on
    stream_options = body.get("stream_options") or {}
    return Sampling(model=body.get("model") or DEFAULT_MODEL_NAME, n=n, max_tokens=max_tokens,
                    temperature=1.0 if temperature is None else temperature, top_k=_number(body, "top_k", None, int),
                    top_p=_number(body, "top_p", None), penalties=parse_penalties(body),
                    ignore_eos=bool(body.get("ignore_eos", False)), stream=bool(body.get("stream", False)),
                    include_usage=bool(stream_options.get("include_usage"))
                    or state.args.stream_response_default_include_usage,
                    continuous_usage=bool(stream_options.get("continuous_usage_stats")),
                    spec_details=bool(body.get("return_spec_tokens_details", False)),
                    seed=_number(body, "seed", None, int))


def parse_penalties(body: dict) -> Penalties:
    """The repetition-shaping parameters, with the bounds SGLang's SamplingParams.verify holds them to."""
    penalties = Penalties(_number(body, "frequency_penalty", 0.0), _number(body, "presence_penalty", 0.0),
                          _number(body, "repetition_penalty", 1.0))
    for name, value in (("frequency_penalty", penalties.frequency), ("presence_penalty", penalties.presence)):
        if not -2 <= value <= 2:
            raise BadRequest(f"{name} must be in [-2, 2], got {value}.")
    if not 0 <= penalties.repetition <= 2:
        raise BadRequest(f"repetition_penalty must be in [0, 2], got {penalties.repetition}.")
    return penalties


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    raise BadRequest("message content must be a string or a list of parts")


def render_chat(messages: Any) -> tuple[str, str]:
    """A plain chat template: (the prompt the model reads, the last user turn)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    turns, last_user = [], ""
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise BadRequest("each message needs a role")
        text = _text_of(message.get("content"))
        turns.append(f"<|{message['role']}|>\n{text}\n")
        if message["role"] == "user":
            last_user = text
    return "".join(turns) + "<|assistant|>\n", last_user


def _jobs(state: ServerState, prompt: str, question: str, sampling: Sampling, thinking: bool,
          require_reasoning: bool = False) -> list[Job]:
    prompt_tokens = count_tokens(prompt)
    limit = state.max_new_tokens(prompt_tokens, sampling.max_tokens)
    return [Job(Ask(prompt, question, state.engine.sample_key(sampling.temperature, sampling.top_k, sampling.top_p,
                                                            sampling.seed),
                    thinking, sampling.ignore_eos, sampling.penalties),
                prompt_tokens, limit, sampling.stream, require_reasoning=require_reasoning,
                temperature=sampling.temperature)
            for _ in range(sampling.n)]


def token_usage(prompt: int, completion: int, prompt_details: dict | None = None, reasoning: int = 0) -> dict:
    """UsageProcessor.calculate_token_usage(...).model_dump(): UsageInfo in its field order."""
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": prompt_details, "reasoning_tokens": reasoning,
            "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None}


def usage_of(generations: list[Generation], n: int) -> dict:
    prompt = sum(gen.prompt_tokens for index, gen in enumerate(generations) if index % n == 0)
    return token_usage(prompt, sum(gen.completion_tokens for gen in generations),
                       reasoning=sum(gen.reasoning.tokens for gen in generations))


class ContinuousUsage:
    """stream_options.continuous_usage_stats: one choice's usage so far, for each chunk built from a step.

    SGLang reads meta_info.completion_tokens of the output the chunk comes from, i.e. the choice's
    tokens up to and including that step; they are counted here as the steps are handed over (with
    n > 1 a choice's generation may have run on by the time its queued step is written)."""

    def __init__(self, choices: Choices, sampling: Sampling, prompt_details: dict | None = None):
        self.active = sampling.continuous_usage
        self._prompts = [gen.prompt_tokens for gen in choices.generations]
        self._sent = [0] * len(self._prompts)
        self._reasoning = [ReasoningCount(job.require_reasoning) for job in choices.jobs]
        self._prompt_details = prompt_details

    def step(self, index: int, tokens: list[str]) -> dict | None:
        """Count a step's tokens; the usage its chunks carry (None when not asked for)."""
        self._sent[index] += len(tokens)
        reasoning = self._reasoning[index].add(tokens)
        if not self.active:
            return None
        return token_usage(self._prompts[index], self._sent[index], self._prompt_details, reasoning)


def sglext_of(generations: list[Generation], sampling: Sampling, ids: dict | None = None) -> dict | None:
    """SglExt in its field order: ``spec_tokens_details`` when asked for and the server speculates (a
    list when n > 1), then ``input_ids``/``output_ids`` from ``ids``; None when empty."""
    sglext = {}
    details = _spec_tokens_details(generations, sampling)
    if details is not None:
        sglext["spec_tokens_details"] = details
    sglext.update(ids or {})
    return sglext or None


def _spec_tokens_details(generations: list[Generation], sampling: Sampling) -> dict | list | None:
    if not sampling.spec_details:
        return None
    details = []
    for gen in generations:
        info = gen.meta_info()
        if any(key in info for key in SPEC_DETAIL_FIELDS):
            details.append({key: info.get(key) or default for key, default in SPEC_DETAIL_FIELDS.items()})
    if not details:
        return None
    return details if sampling.n > 1 else details[0]


def _finish(gen: Generation) -> tuple[str | None, Any]:
    reason = gen.finish_reason
    if reason is None:
        return None, None
    return reason["type"], reason.get("matched")


class ReasoningSplit:
    """What SGLang's reasoning parser does to a thinking reply: text inside <think> goes to
    reasoning_content, the rest to content. Off (everything is content) without a parser."""

    def __init__(self, active: bool):
        self.active = active
        self.inside = False

    def split(self, tokens: list[str]) -> tuple[str, str]:
        if not self.active:
            return "", "".join(tokens)
        reasoning, content = [], []  # type: list[str], list[str]
        for token in tokens:
            if token == THINK_START:
                self.inside = True
            elif token == THINK_END:
                self.inside = False
            else:
                (reasoning if self.inside else content).append(token)
        return "".join(reasoning), "".join(content)


# --- chat ------------------------------------------------------------------------------------

async def chat_completions(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app[ServerState.KEY]
    try:
        body = await _json_body(request)
        sampling = parse_sampling(body, state, default_max_tokens=None)
        prompt, question = render_chat(body.get("messages"))
        returns = ChatReturns.parse(body, request.headers, state.args, sampling.stream)
    except BadRequest as err:
        return error_response(str(err), err_type=err.err_type)
    parser = state.args.reasoning_parser
    thinking = reasoning_requested(parser, body.get("chat_template_kwargs"))
    parsed = thinking and separates_reasoning(parser)  # SGLang's require_reasoning
    choices = Choices(state.engine, _jobs(state, prompt, question, sampling, thinking, require_reasoning=parsed))
    splits = [ReasoningSplit(parsed and body.get("separate_reasoning", True) is not False) for _ in choices.jobs]
    if sampling.stream:
        return await _chat_stream(request, state, choices, sampling, splits, returns)
    generations = await choices.run_to_end()
    rid, created = generations[0].rid, int(time.time())
    response_choices = []
    for index, gen in enumerate(generations):
        reasoning, content = splits[index].split(gen.tokens)
        finish, matched = _finish(gen)
        content, reasoning = (reply_faults.text(state.config.faults, part) for part in (content, reasoning))
        choice = {"index": index, "message": {"role": "assistant", "content": content,
                                              "reasoning_content": reasoning or None},
                  "logprobs": None, "finish_reason": finish, "matched_stop": matched}
        if returns.prompt_token_ids:
            choice["prompt_token_ids"] = encode(choices.jobs[index].ask.prompt)
        if returns.response_token_ids:
            choice["response_token_ids"] = gen.output_ids()
        if returns.meta_info:  # serving_chat._build_chat_response: ret_item["meta_info"], as /generate has it
            choice["meta_info"] = gen.meta_info()
        if body.get("logprobs"):  # serving_chat._process_response_logprobs (sglang_sim/logprobs.py)
            choice["logprobs"] = logprobs.chat_logprobs(state.engine.persona, choices.jobs[index].ask, gen.tokens,
                                                        state.config.faults, int(body.get("top_logprobs") or 0))
        response_choices.append(choice)
    payload = {"id": rid, "object": "chat.completion", "created": created, "model": sampling.model,
               "choices": response_choices,
               "usage": reply_faults.usage(state.config.faults, usage_of(generations, sampling.n)),
               "metadata": {"weight_version": "default"}}
    sglext = sglext_of(generations, sampling, returns.sglext_ids(choices))
    if sglext is not None:
        payload["sglext"] = sglext
    return json_response(payload)


def _chat_chunk(rid: str, created: int, model: str, index: int, delta: dict, finish=None, matched=None,
                usage: dict | None = None) -> bytes:
    """sse_utils.build_sse_content: StreamChunk omits ``usage`` when it is None."""
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
             "choices": [{"index": index, "delta": {"reasoning_content": None, **delta}, "logprobs": None,
                          "finish_reason": finish, "matched_stop": matched}]}
    if usage is not None:
        chunk["usage"] = usage
    return sse_event(chunk)


async def _chat_stream(request, state: ServerState, choices: Choices, sampling: Sampling,
                       splits: list[ReasoningSplit], returns: ChatReturns) -> web.StreamResponse:
    response = await state.open_stream(request)
    rid, created, model = choices.generations[0].rid, int(time.time()), sampling.model
    started = set()
    # serving_chat._generate_stream_content: the reasoning and the content chunk of a step carry the
    # choice's usage so far; the role chunk and the finish chunk never do (build_sse_content without usage).
    continuous = ContinuousUsage(choices, sampling, {"cached_tokens": 0} if state.args.enable_cache_report else None)
    async with state.streaming(request, response) as send, choices.stepping() as steps:
        async for index, tokens in steps:
            events = []  # a step's chunks go out in one write, as SGLang's one yield per step does
            if index not in started:
                started.add(index)
                events.append(_chat_chunk(rid, created, model, index, {"role": "assistant", "content": ""}))
            usage = continuous.step(index, tokens)
            reasoning, content = splits[index].split(tokens)
            if reasoning:
                events.append(_chat_chunk(rid, created, model, index, {"reasoning_content": reasoning}, usage=usage))
            if content:
                events.append(_chat_chunk(rid, created, model, index, {"content": content}, usage=usage))
            if events:
                await send(*events)
        closing = [_chat_chunk(rid, created, model, index, {}, *_finish(gen))
                   for index, gen in enumerate(choices.generations)]
        sglext = sglext_of(choices.generations, sampling, returns.sglext_ids(choices))
        if sglext is not None:
            closing.append(sse_event({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                                      "choices": [], "usage": None, "sglext": sglext}))
        if sampling.include_usage:
            closing.append(sse_event({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                                      "choices": [], "usage": usage_of(choices.generations, sampling.n)}))
        await send(*closing, b"data: [DONE]\n\n", last=True)
    return response


# --- completions -----------------------------------------------------------------------------

async def completions(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app[ServerState.KEY]
    try:
        body = await _json_body(request)
        sampling = parse_sampling(body, state, default_max_tokens=16)
        prompts = _prompts(body.get("prompt"))
    except BadRequest as err:
        return error_response(str(err), err_type=err.err_type)
    jobs = [job for prompt in prompts for job in _jobs(state, prompt, prompt, sampling, thinking=False)]
    choices = Choices(state.engine, jobs)
    # CompletionRequest.return_token_ids: choices[].token_ids and prompt_token_ids, streaming too
    # (serving_completions: _build_completion_response, _generate_completion_stream)
    token_ids = bool(body.get("return_token_ids"))
    if sampling.stream:
        return await _completion_stream(request, state, choices, sampling, token_ids)
    generations = await choices.run_to_end()
    response_choices = []
    for index, gen in enumerate(generations):
        finish, matched = _finish(gen)
        choice = {"index": index, "text": reply_faults.text(state.config.faults, gen.text), "logprobs": None,
                  "finish_reason": finish,
                  "matched_stop": matched}
        if token_ids:
            choice.update(token_ids=gen.output_ids(), prompt_token_ids=encode(jobs[index].ask.prompt))
        response_choices.append(choice)
    payload = {"id": generations[0].rid, "object": "text_completion", "created": int(time.time()),
               "model": sampling.model, "choices": response_choices,
               "usage": reply_faults.usage(state.config.faults, usage_of(generations, sampling.n)),
               "metadata": {"weight_version": "default"}}
    sglext = sglext_of(generations, sampling)
    if sglext is not None:
        payload["sglext"] = sglext
    return json_response(payload)


def _prompts(prompt: Any) -> list[str]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(item, str) for item in prompt):
        return prompt
    raise BadRequest("prompt must be a string or a non-empty list of strings")


async def _completion_stream(request, state: ServerState, choices: Choices, sampling: Sampling, token_ids: bool):
    response = await state.open_stream(request)
    rid, created, model = choices.generations[0].rid, int(time.time()), sampling.model
    started = set()
    # serving_completions._generate_completion_stream: every step's chunk, the last (with finish_reason)
    # included, carries the choice's usage so far; no cached-token details there
    continuous = ContinuousUsage(choices, sampling)
    async with state.streaming(request, response) as send, choices.stepping() as steps:
        async for index, tokens in steps:
            finish, matched = _finish(choices.generations[index])
            choice = {"index": index, "text": "".join(tokens), "logprobs": None, "finish_reason": finish,
                      "matched_stop": matched}
            if token_ids:  # the step's ids (with n > 1 other steps may have run on since); the prompt's first
                choice["token_ids"] = [token_id(piece) for piece in tokens]
                if index not in started:
                    started.add(index)
                    choice["prompt_token_ids"] = encode(choices.jobs[index].ask.prompt)
            await send(sse_event({"id": rid, "object": "text_completion", "created": created, "model": model,
                                  "choices": [choice], "usage": continuous.step(index, tokens)}))
        closing = []
        sglext = sglext_of(choices.generations, sampling)
        if sglext is not None:
            closing.append(sse_event({"id": rid, "object": "text_completion", "created": created, "model": model,
                                      "choices": [], "usage": None, "sglext": sglext}))
        if sampling.include_usage:
            usage = {key: value for key, value in usage_of(choices.generations, sampling.n).items()
                     if value is not None}
            closing.append(sse_event({"id": rid, "object": "text_completion", "created": created, "model": model,
                                      "choices": [], "usage": usage}))
        await send(*closing, b"data: [DONE]\n\n", last=True)
    return response


async def _json_body(request: web.Request) -> dict:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadRequest("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body
