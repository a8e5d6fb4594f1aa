"""SGLang's own bench_serving, run on the CPU against a server with the speed suite's traffic.

    run_bench_serving(python, base_url, model, prompts, output_len, concurrency, warmup_requests, workdir,
                      prompt_lens=None, api_key="EMPTY", print_requests=True) -> BenchServingRun

``python`` is the SGLang venv's interpreter (``bash .ci/sglang-bench-serving.sh`` prints it; ``find_python``
finds it). It runs bench_serving's real command line, ``python -m sglang.benchmark.serving`` (the old path
``sglang.bench_serving`` is a deprecated alias of it in the release), through bench/sglang_bench_serving_child.py,
which only stubs torchvision (see there) and adds nothing to the run:

    --backend sglang-oai-chat --base-url URL --model MODEL --tokenizer DIR
    --dataset-name openai --dataset-path requests.jsonl --num-prompts N
    --max-concurrency C --request-rate inf --warmup-requests W
    --output-file bench_serving.jsonl --output-details --print-requests --disable-tqdm

Identical traffic. The CLI, not a driver calling ``benchmark()``: the release's ``openai`` dataset reproduces our
prompts exactly. Each JSONL line is one request, ``{"messages": [{"role": "user", "content": PROMPT}],
"max_tokens": OUTPUT_LEN, "stream_options": {"include_usage": true, "continuous_usage_stats": true}}``, read in file
order (no shuffle, unlike ``custom``) and sent in that order, all at once behind a ``--max-concurrency`` semaphore (rate
inf), as the speed suite sends them. Each request is then the speed suite's: streamed chat completions to
``/v1/chat/completions`` with the same messages, ``temperature`` 0.0, ``ignore_eos`` true (bench_serving's
default) and ``stream_options`` from the line (extra fields pass through to the body); the one difference is
the key of the output cap, ``max_completion_tokens`` (bench_serving always sends that; SGLang and the
simulator take it as ``max_tokens``). ``api_key`` goes out as ``Authorization: Bearer`` like the suite's.
Warm-up differs: bench_serving warms up with ``warmup_requests`` copies of the FIRST prompt (output capped
at 32 tokens, without ``stream_options``) at the same concurrency, then sleeps 1 s; the suite uses distinct
warm-up prompts. The simulator keeps no prefix cache, so that reuse changes nothing there.

Tokenizer. bench_serving counts tokens with ``--tokenizer``: the prompt lengths of the dataset (through the
chat template), the retokenized output, and, because /server_info reports an accept length, the tokens of
each streamed chunk, over which it spreads the chunk's gap (its ITL is per token). ``build_tokenizer``
writes one that splits exactly as sglang_sim/tokenizer.py (one token per ``PIECE_PATTERN`` match) with the
simulator's chat template; tests/test_bench_serving_side.py holds it to ``count_tokens``.

The record. ``metrics``: bench_serving's own numbers from its result line, unrounded (what it prints,
rounded, is ``summary``). Per request, in our prompt order: from ``--output-details`` ``prompt_len`` (the
server's ``usage.prompt_tokens``), ``output_len`` (``usage.completion_tokens``), ``ttft_s``, ``itl_s`` (the
raw gaps between content chunks, NOT divided per token: the per-token split is only inside its ITL
metrics), ``generated_text`` and ``error``. The output file has no start time and no latency; those,
and ``text_chunks`` (every content chunk after the first), come from ``--print-requests``, which prints
each finished request's ``RequestFuncOutput`` (at a cost of a deepcopy and a print per request, outside
that request's timed window but on the event loop all streams share; ``print_requests=False`` leaves them
out and those fields None). ``start_time`` is bench_serving's ``time.perf_counter()`` at send, which on
Linux is CLOCK_MONOTONIC, the clock of ``time.monotonic()`` in every process of the host (the child
reports both; ``start_time`` is None where they differ); ``latency_s`` runs to the end of the stream
(``[DONE]``). ``tpot_s`` is bench_serving's formula, (latency − ttft) / (output_len − 1). Not recorded
anywhere by bench_serving: the response ``id`` (pair with the simulator's emission log by time:
``start_time`` <= arrival <= ``start_time + ttft_s``), per-request TPOT (derived) and, for streamed chat,
a per-request accept length.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dspark_ci.ground.sglang.resolver import DEFAULT_VENV_PYTHON  # noqa: E402
from dspark_ci.sglang_sim.tokenizer import PIECE_PATTERN, onig_pattern  # noqa: E402

CHILD = Path(__file__).resolve().parent / "sglang_bench_serving_child.py"
BACKEND = "sglang-oai-chat"
INSTALL_HINT = "install it with `bash .ci/sglang-bench-serving.sh` (prints the interpreter; DSPARK_SGLANG_PYTHON)"
# dspark_ci.sglang_sim.openai_api.render_chat in Jinja: every turn as "<|role|>\n{text}\n", then "<|assistant|>\n".
# The last newline is an expression: Jinja drops a template's trailing newline.
CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
                 "<|assistant|>{{ '\\n' }}")
SUMMARY_START = " Serving Benchmark Result "
REQUEST_END = re.compile(r'^rid=\S+ time=\S+ time_delta=\S+ message="request end" output="(.*)"$')
PERCENTILED = ("ttft", "tpot", "itl", "e2e_latency")


class BenchServingError(RuntimeError):
    """bench_serving failed, or completed fewer requests than it was sent."""


@dataclass(frozen=True)
class BenchServingMetrics:
    """bench_serving's run-level numbers as its result line has them (milliseconds, tokens/s)."""

    completed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    max_output_tokens_per_s: float
    accept_length: float | None  # /server_info's avg_spec_accept_length; None without speculation
    mean_ttft_ms: float
    median_ttft_ms: float
    p90_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    p90_tpot_ms: float
    p99_tpot_ms: float
    mean_itl_ms: float  # per token when accept_length is set (each chunk gap split over its tokens)
    median_itl_ms: float
    p90_itl_ms: float
    p99_itl_ms: float
    mean_e2e_latency_ms: float
    median_e2e_latency_ms: float
    p90_e2e_latency_ms: float
    p99_e2e_latency_ms: float

    @classmethod
    def from_result(cls, result: Mapping[str, Any]) -> BenchServingMetrics:
        stats = {f"{kind}_{name}_ms": result[f"{kind}_{name}_ms"]
                 for name in PERCENTILED for kind in ("mean", "median", "p90", "p99")}
        return cls(completed=result["completed"], duration_s=result["duration"],
                   total_input_tokens=result["total_input_tokens"],
                   total_output_tokens=result["total_output_tokens"],
                   request_throughput=result["request_throughput"], output_throughput=result["output_throughput"],
                   max_output_tokens_per_s=result["max_output_tokens_per_s"],
                   accept_length=result.get("accept_length"), **stats)


@dataclass(frozen=True)
class BenchServingRequest:
    """One measured request as bench_serving saw it (seconds)."""

    index: int  # position in our prompts, which is also bench_serving's send order
    prompt_len: int
    output_len: int
    ttft_s: float
    itl_s: tuple[float, ...]  # raw gaps between content chunks (a chunk may carry several tokens)
    generated_text: str
    error: str
    start_time: float | None  # perf_counter at send = time.monotonic(); None without --print-requests
    latency_s: float | None  # send to the end of the stream; None without --print-requests
    text_chunks: tuple[str, ...] | None  # the content of each chunk after the first, one per itl_s entry

    @property
    def tpot_s(self) -> float | None:
        """bench_serving's per-request TPOT, which it computes but does not write out."""
        if self.latency_s is None or self.output_len < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_len - 1)


@dataclass(frozen=True)
class BenchServingRun:
    metrics: BenchServingMetrics
    requests: tuple[BenchServingRequest, ...]
    summary: str  # the "Serving Benchmark Result" block bench_serving printed
    sglang_version: str
    argv: tuple[str, ...]
    result: Mapping[str, Any] = field(repr=False)  # its whole result line, per-request details left out


# ---------------------------------------------------------------- the venv and the tokenizer


def find_python() -> str | None:
    """The SGLang venv's interpreter: $DSPARK_SGLANG_PYTHON, else the repo's .cache/sglang-venv; None if absent."""
    for candidate in (os.environ.get("DSPARK_SGLANG_PYTHON", ""), str(DEFAULT_VENV_PYTHON)):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def build_tokenizer(python: str, directory: Path) -> Path:
    """Write the simulator-counting tokenizer into ``directory`` (with the venv's tokenizers) and return it."""
    request = {"pattern": onig_pattern(PIECE_PATTERN), "chat_template": CHAT_TEMPLATE}
    _child(python, ["tokenizer", str(directory)], json.dumps(request), "writing the tokenizer")
    return directory


@dataclass(frozen=True)
class Counted:
    texts: list[int]  # tokens of each text
    chats: list[int]  # tokens of each chat, chat template applied
    rendered: list[str]  # each chat as the chat template renders it


def count_with_tokenizer(python: str, directory: Path, texts: Sequence[str] = (),
                         chats: Sequence[Sequence[Mapping[str, str]]] = ()) -> Counted:
    """Token counts as bench_serving gets them from the tokenizer in ``directory``."""
    request = json.dumps({"texts": list(texts), "chats": [list(chat) for chat in chats]})
    return Counted(**json.loads(_child(python, ["count", str(directory)], request, "counting tokens")))


def _child(python: str, args: list[str], stdin: str, what: str) -> str:
    done = subprocess.run([python, str(CHILD), *args], input=stdin, capture_output=True, text=True,
                          env=_child_env(None), timeout=300)
    if done.returncode != 0:
        raise BenchServingError(f"{what} with {python} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def _child_env(api_key: str | None) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    # bench_serving flushes the server's cache after warm-up when it believes it runs in SGLang's CI.
    env.pop("SGLANG_IS_IN_CI", None)
    if api_key is not None:  # bench_serving's only way to send a key: Authorization: Bearer $OPENAI_API_KEY
        env["OPENAI_API_KEY"] = api_key
    return env


# ---------------------------------------------------------------- the run


# The speed suite's stream options (suites/speed.py): the same response bytes for both clients to read.
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


def write_requests(path: Path, prompts: Sequence[str], output_len: int) -> Path:
    """The ``openai`` dataset: one chat request per line, in our order."""
    with path.open("w", encoding="utf-8") as out:
        for prompt in prompts:
            out.write(json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": output_len,
                                  "stream_options": STREAM_OPTIONS}) + "\n")
    return path


def bench_serving_argv(base_url: str, model: str, tokenizer: Path, requests: Path, count: int, concurrency: int,
                       warmup_requests: int, output_file: Path, print_requests: bool) -> list[str]:
    argv = ["--backend", BACKEND, "--base-url", base_url, "--model", model, "--tokenizer", str(tokenizer),
            "--dataset-name", "openai", "--dataset-path", str(requests), "--num-prompts", str(count),
            "--max-concurrency", str(concurrency), "--request-rate", "inf",
            "--warmup-requests", str(warmup_requests), "--output-file", str(output_file), "--output-details",
            "--disable-tqdm"]
    return argv + (["--print-requests"] if print_requests else [])


def run_bench_serving(python: str, base_url: str, model: str, prompts: Sequence[str], output_len: int,
                      concurrency: int, warmup_requests: int, workdir: Path, *,
                      prompt_lens: Sequence[int] | None = None, api_key: str | None = "EMPTY",
                      print_requests: bool = True, timeout: float = 1800) -> BenchServingRun:
    """Run bench_serving once; ``workdir`` keeps its inputs, output file, stdout and stderr.

    ``prompt_lens``, when given (the speed suite's ``usage.prompt_tokens`` per prompt), must equal what
    the server reported to bench_serving, request by request: the proof that the traffic was the same.
    """
    if not prompts:
        raise ValueError("run_bench_serving: no prompts")
    workdir.mkdir(parents=True, exist_ok=True)
    tokenizer = workdir / "tokenizer"
    if not (tokenizer / "tokenizer.json").exists():
        build_tokenizer(python, tokenizer)
    output_file = workdir / "bench_serving.jsonl"
    output_file.unlink(missing_ok=True)  # bench_serving appends
    argv = bench_serving_argv(base_url, model, tokenizer, write_requests(workdir / "requests.jsonl", prompts,
                                                                         output_len),
                              len(prompts), concurrency, warmup_requests, output_file, print_requests)
    stdout, stderr = workdir / "stdout.txt", workdir / "stderr.txt"
    with stdout.open("w") as out, stderr.open("w") as err:
        done = subprocess.run([python, str(CHILD), "run", *argv], stdout=out, stderr=err, cwd=workdir,
                              env=_child_env(api_key), timeout=timeout)
    printed, errors = stdout.read_text(), stderr.read_text()
    if done.returncode != 0 or not output_file.exists():
        hint = f"\n{python} lacks a module bench_serving imports: {INSTALL_HINT}" if "ModuleNotFoundError" in errors else ""
        raise BenchServingError(f"bench_serving exited {done.returncode}"
                                f"{'' if output_file.exists() else ' without writing its output file'}"
                                f"{_printed_failures(printed)}; stdout ends:\n{printed[-1500:]}\n"
                                f"stderr ends:\n{errors[-3000:]}{hint}")
    run = _parse_run(output_file, printed, argv)
    _check_complete(run, len(prompts))
    if prompt_lens is not None:
        _check_prompt_lens(run, prompt_lens)
    return run


# ---------------------------------------------------------------- reading what it wrote


def _parse_run(output_file: Path, printed: str, argv: list[str]) -> BenchServingRun:
    lines = [line for line in output_file.read_text().splitlines() if line.strip()]
    result = json.loads(lines[-1])
    head = next(json.loads(line) for line in printed.splitlines() if line.startswith('{"sglang"'))
    same_clock = head["perf_counter"] == head["monotonic"]
    ends = [_request_end(line) for line in printed.splitlines()]
    requests = _requests(result, [end for end in ends if end is not None], same_clock)
    details = {"input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"}
    return BenchServingRun(metrics=BenchServingMetrics.from_result(result), requests=requests,
                           summary=_summary(printed), sglang_version=head["sglang"], argv=tuple(argv),
                           result={k: v for k, v in result.items() if k not in details})


def _summary(printed: str) -> str:
    lines = printed.splitlines()
    start = next((i for i, line in enumerate(lines) if SUMMARY_START in line), None)
    if start is None:
        return ""
    end = next((i for i in range(start + 1, len(lines)) if lines[i] == "=" * 50), len(lines) - 1)
    return "\n".join(lines[start:end + 1])


def _request_end(line: str) -> dict[str, Any] | None:
    """The fields of a ``--print-requests`` "request end" line's ``RequestFuncOutput(...)`` repr."""
    match = REQUEST_END.match(line)
    if match is None:
        return None
    call = ast.parse(match.group(1), mode="eval").body
    fields = {}
    for keyword in getattr(call, "keywords", ()):
        try:
            fields[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:  # a field that is not a literal: none of those we read
            pass
    return fields


def _requests(result: Mapping[str, Any], ends: list[dict[str, Any]], same_clock: bool
              ) -> tuple[BenchServingRequest, ...]:
    # The output file lists requests in send order; a printed end (warm-up ones too) is matched to its
    # request by its exact TTFT and gaps, which both print with full float precision.
    by_timing = {(end.get("ttft"), tuple(end.get("itl") or ())): end for end in ends}
    requests = []
    for index, ttft in enumerate(result["ttfts"]):
        itl = tuple(result["itls"][index])
        end = by_timing.get((ttft, itl)) if result["errors"][index] == "" else None
        chunks = end.get("text_chunks") if end else None
        requests.append(BenchServingRequest(
            index=index, prompt_len=result["input_lens"][index], output_len=result["output_lens"][index],
            ttft_s=ttft, itl_s=itl, generated_text=result["generated_texts"][index], error=result["errors"][index],
            start_time=end["start_time"] if end and same_clock else None,
            latency_s=end["latency"] if end else None, text_chunks=tuple(chunks) if chunks is not None else None))
    return tuple(requests)


def _printed_failures(printed: str) -> str:
    """What the failed requests it printed said (it crashes on its metrics when every request failed)."""
    ends = [end for end in map(_request_end, printed.splitlines()) if end is not None]
    errors = [_last_line(end.get("error") or "") for end in ends if not end.get("success")]
    return f" after {len(errors)} of {len(ends)} requests failed (first: {errors[0]})" if errors else ""


def _last_line(error: str) -> str:
    return error.strip().splitlines()[-1] if error.strip() else "(no error text)"


def _check_complete(run: BenchServingRun, sent: int) -> None:
    if run.metrics.completed >= sent:
        return
    errors = [f"request {r.index}: {_last_line(r.error)}" for r in run.requests if r.error or r.output_len == 0][:5]
    raise BenchServingError(f"bench_serving completed {run.metrics.completed} of {sent} requests; first failures:\n"
                            + "\n".join(errors))


def _check_prompt_lens(run: BenchServingRun, prompt_lens: Sequence[int]) -> None:
    differing = [(r.index, expected, r.prompt_len) for r, expected in zip(run.requests, prompt_lens, strict=False)
                 if r.prompt_len != expected]
    if len(prompt_lens) != len(run.requests) or differing:
        raise BenchServingError(f"bench_serving's requests are not ours: {len(run.requests)} requests for "
                                f"{len(prompt_lens)} prompt lengths; (index, ours, server's) differing: "
                                f"{differing[:5]}")
