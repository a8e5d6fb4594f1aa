"""Registers this package's ops as ``torch.ops.sgl_kernel.<name>``, the names SGLang calls on CPU.

``torch.library.custom_op`` declares each op's schema from its Python signature and which arguments it writes
(``mutates_args``), as the C++ CPU extension's ``TORCH_LIBRARY_FRAGMENT(sgl_kernel, m)`` does."""

from __future__ import annotations

from collections.abc import Callable

import torch
from dspark_ci.sglang_sim.cpu_kernels import attention, linear, memory, speculative

# op name -> (implementation, the arguments it writes in place)
OPS: dict[str, tuple[Callable[..., object], tuple[str, ...]]] = {
    "assign_req_to_token_pool_cpu": (memory.assign_req_to_token_pool, ("req_to_token",)),
    # writes through the buffers' addresses, none of its arguments
    "copy_all_layer_kv_cache_cpu": (memory.copy_all_layer_kv_cache, ()),
    "assign_extend_cache_locs_cpu": (speculative.assign_extend_cache_locs, ("out_cache_loc",)),
    "assign_draft_cache_locs_contiguous_cpu": (speculative.assign_draft_cache_locs_contiguous, ("out_cache_loc",)),
    "fill_accept_out_cache_loc_cpu": (speculative.fill_accept_out_cache_loc, ("accept_out_cache_loc",)),
    "fill_bonus_tokens_cpu": (speculative.fill_bonus_tokens, ("bonus_tokens",)),
    "build_tree_kernel_efficient_cpu": (speculative.build_tree_kernel_efficient, (
        "tree_mask", "positions", "retrive_index", "retrive_next_token", "retrive_next_sibling")),
    "verify_tree_greedy_cpu": (speculative.verify_tree_greedy, ("predicts", "accept_index", "accept_token_num")),
    "decode_attention_cpu": (attention.decode_attention, ("k_buffer", "v_buffer", "output")),
    "extend_attention_cpu": (attention.extend_attention, ("o_extend",)),
    "build_draft_decode_metadata_cpu": (attention.build_draft_decode_metadata, ()),
    "convert_weight_packed": (linear.convert_weight_packed, ()),
    "weight_packed_linear": (linear.weight_packed_linear, ()),
    "reconstruct_indices_from_tree_mask": (speculative.reconstruct_indices_from_tree_mask, (
        "positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling")),
}


def register() -> None:
    """Define every op once per process (a second import of ``sgl_kernel`` finds them defined)."""
    for name, (fn, mutated) in OPS.items():
        if hasattr(torch.ops.sgl_kernel, name):
            continue
        torch.library.custom_op(f"sgl_kernel::{name}", fn, mutates_args=mutated, device_types="cpu")
