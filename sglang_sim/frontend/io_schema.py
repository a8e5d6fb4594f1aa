"""``python -m dspark_ci.sglang_sim.frontend.io_schema`` (in the SGLang venv): the io_struct messages the scheduler
stand-in speaks, as this SGLang defines them, and one step of ours sent and received through SGLang's own IPC calls.

Prints JSON: ``{"sglang": VERSION, "messages": {name: [[field, required], ...]}, "step": {...}}``.
tests/test_frontend_io_struct.py holds it to tests/golden/frontend/io_struct.txt, so a release that renames,
adds or drops a field of these messages fails there instead of in a run.
"""

from __future__ import annotations

import json
import sys
from typing import Any

# What scheduler.py reads (requests) or builds (replies): a change in any of them changes what we must speak.
MESSAGES = ("TokenizedGenerateReqInput", "BatchTokenizedGenerateReqInput", "BatchTokenIDOutput", "AbortReq",
            "GetInternalStateReq", "GetInternalStateReqOutput", "FlushCacheReqInput", "FlushCacheReqOutput",
            "SetInternalStateReq", "SetInternalStateReqOutput", "FreezeGCReq")
SAMPLING_FIELDS_READ = ("max_new_tokens", "temperature", "top_k", "top_p", "frequency_penalty", "presence_penalty",
                        "repetition_penalty", "ignore_eos", "skip_special_tokens",
                        "spaces_between_special_tokens", "no_stop_trim")


def message_fields() -> dict:
    import msgspec
    from sglang.srt.managers import io_struct

    return {name: [[f.name, f.required] for f in msgspec.structs.fields(getattr(io_struct, name))]
            for name in MESSAGES}


def through_ipc(message: Any) -> Any:
    """``message`` sent and received as the scheduler and the DetokenizerManager do (io_struct.sock_send and
    sock_recv over a ZMQ pair: msgpack, or pickle when SGLang's environment selects it)."""
    import zmq
    from sglang.srt.managers import io_struct

    context = zmq.Context()
    receiver, sender = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    receiver.bind("inproc://step")
    sender.connect("inproc://step")
    try:
        io_struct.sock_send(sender, message)
        return io_struct.sock_recv(receiver)
    finally:
        sender.close(linger=0)
        receiver.close(linger=0)
        context.term()


def one_step() -> dict:
    """A request's first step through token_output and SGLang's IPC codec, read back."""
    from types import SimpleNamespace

    from dspark_ci.sglang_sim.engine import Generation
    from dspark_ci.sglang_sim.frontend.scheduler import Running, token_output
    from dspark_ci.sglang_sim.speculation import SpecShape, SpecStats
    from sglang.srt.managers import io_struct
    from sglang.srt.observability.req_time_stats import SchedulerReqTimeStats
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    params.normalize(None)
    missing = [name for name in SAMPLING_FIELDS_READ if not hasattr(params, name)]
    request = SimpleNamespace(rid="r1", http_worker_ipc=None, sampling_params=params, return_logprob=False)
    spec = SpecStats(SpecShape("DSPARK", 4, 3))
    spec.record_step(2)
    gen = Generation("r1", 0, None, 3, spec, tokens=["a", "b", "c"], finish_reason={"type": "length", "length": 3})
    running = Running(request, gen, [5, 6, 7], SchedulerReqTimeStats(), output_ids=[10, 11, 12])
    decoded = through_ipc(token_output(io_struct, running))
    return {"type": type(decoded).__name__, "output_ids": [list(ids) for ids in decoded.output_ids],
            "decode_ids": [list(ids) for ids in decoded.decode_ids], "read_offsets": decoded.read_offsets,
            "completion_tokens": decoded.completion_tokens, "spec_verify_ct": decoded.spec_verify_ct,
            "spec_num_correct_drafts": decoded.spec_num_correct_drafts,
            "finished_reasons": decoded.finished_reasons, "sampling_fields_missing": missing}


def main() -> int:
    import sglang

    print(json.dumps({"sglang": sglang.__version__, "messages": message_fields(), "step": one_step()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
