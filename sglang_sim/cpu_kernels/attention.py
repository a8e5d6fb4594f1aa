"""``IntelAMXAttnBackend``'s CPU attention ops: decode (one query per sequence; draft decode too), extend (a chunk
of queries after a cached prefix; speculative verify with its tree mask), and the draft-decode table.

A softmax in float32, the definition the C++ kernels compute in tiles. Heads are grouped as SGLang groups them
(query head h reads KV head ``h // (q_heads // kv_heads)``).

Here this file gathers each request's keys and says which of them each query sees; ``attention.cpp`` (compiled
once, ``native.py``) computes each query alone, over exactly those keys, in their cache order, whether it comes
from a decode batch or an extend/verify batch: a token's attention then has the same bits in a speculative verify
as in plain decoding, so greedy parity between the two is exact rather than within rounding. Batched reductions
over different shapes do not guarantee that (measured: 3 of 600 rows differed in their last bit), and one flipped
bit can flip a near-tie argmax."""

from __future__ import annotations

import torch
from dspark_ci.sglang_sim.cpu_kernels import native

NO_SINKS = torch.empty(0)


def _not_supported(what: str) -> NotImplementedError:
    return NotImplementedError(f"dspark_ci.sglang_sim.cpu_kernels: {what} is not played by this CPU stand-in "
                               "(README.md)")


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor, sm_scale: float,
            logit_cap: float, sinks: torch.Tensor | None) -> torch.Tensor:
    """Queries ``q [T, H, D]`` over ``keys [S, KVH, D]``/``values [S, KVH, Dv]`` (float32), query t seeing the
    keys ``visible[t]`` marks; ``[T, H, Dv]`` float32."""
    sink = NO_SINKS if sinks is None else sinks.float()
    return native.module().attend(q.float(), keys, values, visible, sm_scale, logit_cap, sink)


def _in_window(query_pos: torch.Tensor, key_pos: torch.Tensor, sliding_window_size: int) -> torch.Tensor:
    """``[queries, keys]``: keys within the last ``sliding_window_size`` positions of each query (itself
    included); all when <= 0."""
    if sliding_window_size <= 0:
        return torch.ones(query_pos.numel(), key_pos.numel(), dtype=torch.bool)
    return (query_pos[:, None] - key_pos[None, :]) < sliding_window_size


def decode_attention(query: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, key_scale: float,
                     value_scale: float, output: torch.Tensor, key: torch.Tensor | None,
                     value: torch.Tensor | None, loc: torch.Tensor, attn_logits: torch.Tensor,
                     req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                     sm_scale: float, logit_cap: float, is_cross_attention: bool, sliding_window_size: int,
                     encoder_lens: torch.Tensor | None, sinks: torch.Tensor | None) -> None:
    """Sequence i's query (row i of ``query``) attends to the ``seq_lens[i]`` cache slots of table row
    ``req_pool_indices[i]``, the last being its own. With ``key``/``value`` the new token's K/V are first written
    to the cache at ``loc`` (the backend leaves that write to the kernel). ``attn_logits`` is the C++ kernel's
    split-K scratch; this needs none."""
    del attn_logits, encoder_lens
    if is_cross_attention:
        raise _not_supported("cross attention (encoder-decoder models)")
    if key is not None and value is not None:
        k_buffer[loc] = key.view(-1, *k_buffer.shape[1:]).to(k_buffer.dtype)
        v_buffer[loc] = value.view(-1, *v_buffer.shape[1:]).to(v_buffer.dtype)
    for i, (row, n) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=False)):
        slots = req_to_token[row, :n].to(torch.int64)
        keys, values = k_buffer[slots].float() * key_scale, v_buffer[slots].float() * value_scale
        visible = _in_window(torch.tensor([n - 1]), torch.arange(n), sliding_window_size)
        output[i] = _attend(query[i][None], keys, values, visible, sm_scale, logit_cap, sinks)[0].to(output.dtype)


def _visible(e: int, prefix: int, own_mask: torch.Tensor | None, is_causal: bool,
             sliding_window_size: int) -> torch.Tensor:
    """``[e, prefix + e]``: per extend token t (position ``prefix + t``), which keys it sees: the prefix, and among
    the extend tokens its tree-mask row, else those up to itself (causal), else all."""
    n = prefix + e
    seen = torch.ones(e, n, dtype=torch.bool)
    if own_mask is not None:
        seen[:, prefix:] = own_mask
    elif is_causal:
        seen[:, prefix:] = torch.ones(e, e, dtype=torch.bool).tril()
    return seen & _in_window(torch.arange(prefix, n), torch.arange(n), sliding_window_size)


def extend_attention(q_extend: torch.Tensor, k_extend: torch.Tensor | None, v_extend: torch.Tensor | None,
                     o_extend: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, key_scale: float,
                     value_scale: float, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                     seq_lens: torch.Tensor, extend_seq_lens: torch.Tensor, extend_start_loc: torch.Tensor,
                     max_len_extend: int | None, sm_scale: float, logit_cap: float, is_cross_attention: bool,
                     sliding_window_size: int, encoder_lens: torch.Tensor | None, sinks: torch.Tensor | None,
                     custom_mask: torch.Tensor | None, is_causal: bool) -> None:
    """Request i's ``extend_seq_lens[i]`` queries (from row ``extend_start_loc[i]``) attend to its cached prefix
    (the first ``seq_lens[i] - extend_seq_lens[i]`` slots of its table row, all visible) and to its own extend
    tokens: causally, or as ``custom_mask`` says (speculative verify's QLEN_ONLY tree mask: per request an
    ``e x e`` block, row = query, column = draft token, True = visible). The extend tokens' K/V come from
    ``k_extend``/``v_extend`` or, when those are None (a layer sharing another's KV), from the cache."""
    del max_len_extend, encoder_lens
    if is_cross_attention:
        raise _not_supported("cross attention (encoder-decoder models)")
    mask_at = 0
    for row, n, e, start in zip(req_pool_indices.tolist(), seq_lens.tolist(), extend_seq_lens.tolist(),
                                extend_start_loc.tolist(), strict=False):
        prefix = n - e
        slots = req_to_token[row, :n].to(torch.int64)
        keys, values = k_buffer[slots].float() * key_scale, v_buffer[slots].float() * value_scale
        if k_extend is not None and v_extend is not None:
            keys = torch.cat([keys[:prefix], k_extend[start:start + e].float()])
            values = torch.cat([values[:prefix], v_extend[start:start + e].float()])
        own = None
        if custom_mask is not None:
            own = custom_mask.reshape(-1)[mask_at:mask_at + e * e].view(e, e).bool()
            mask_at += e * e
        visible = _visible(e, prefix, own, is_causal, sliding_window_size)
        out = _attend(q_extend[start:start + e], keys, values, visible, sm_scale, logit_cap, sinks)
        o_extend[start:start + e] = out.to(o_extend.dtype)


def build_draft_decode_metadata(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                                seq_lens: torch.Tensor, topk: int, num_steps: int, pool_len: int) -> torch.Tensor:
    """The table EAGLE's draft-decode steps attend through: row ``i * topk + k`` holds request i's verified slots
    (its first ``seq_lens[i]`` table entries) followed by candidate k's draft slots, which the request's row keeps
    contiguously from ``seq_lens[i] + k * num_steps`` (``assign_draft_cache_locs_contiguous``)."""
    out = torch.zeros(req_pool_indices.numel() * topk, pool_len, dtype=req_to_token.dtype)
    for i, (row, n) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=False)):
        for k in range(topk):
            out[i * topk + k, :n] = req_to_token[row, :n]
            drafts = req_to_token[row, n + k * num_steps:n + (k + 1) * num_steps]
            out[i * topk + k, n:n + drafts.numel()] = drafts
    return out
