"""The KV pool's CPU ops: the request-to-token table and the all-layer KV row copy."""

from __future__ import annotations

import ctypes

import torch


def assign_req_to_token_pool(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                             start_offset: torch.Tensor, end_offset: torch.Tensor, out_cache_loc: torch.Tensor,
                             pool_len: int) -> None:
    """Request ``i`` owns ``out_cache_loc``'s slice after the lengths of requests ``0..i-1`` (``end - start``
    each) and writes it to ``req_to_token[req_pool_indices[i], start[i]:end[i]]`` (SGLang's Triton
    ``assign_req_to_token_pool``; ``pool_len`` is the table's row length, which indexing already knows)."""
    del pool_len
    starts, ends = start_offset.tolist(), end_offset.tolist()
    rows = req_pool_indices.tolist()
    out = 0
    for row, start, end in zip(rows, starts, ends, strict=False):
        n = max(end - start, 0)
        if n:
            req_to_token[row, start:end] = out_cache_loc[out:out + n].to(req_to_token.dtype)
        out += n


def _rows_at(address: int, stride: int, rows: int) -> torch.Tensor:
    """A byte view of ``rows`` rows of ``stride`` bytes at ``address`` (a live buffer of the KV pool)."""
    raw = (ctypes.c_uint8 * (stride * rows)).from_address(address)
    return torch.frombuffer(raw, dtype=torch.uint8).view(rows, stride)


def copy_all_layer_kv_cache(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor,
                            src_loc: torch.Tensor) -> None:
    """In every buffer ``b`` (a K or V buffer of one layer, given by address and row stride in bytes), row
    ``tgt_loc[j]`` becomes what row ``src_loc[j]`` held before the call: all sources are read before any target
    is written, so overlapping moves are safe (SGLang's Triton ``copy_all_layer_kv_cache_tiled``)."""
    if tgt_loc.numel() == 0:
        return
    tgt, src = tgt_loc.to(torch.int64), src_loc.to(torch.int64)
    rows = int(torch.maximum(tgt.max(), src.max()).item()) + 1
    for address, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=False):
        view = _rows_at(int(address), int(stride), rows)
        view[tgt] = view[src]  # advanced indexing gathers into a new tensor first
