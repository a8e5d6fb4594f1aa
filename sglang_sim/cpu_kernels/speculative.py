"""The speculative workers' CPU ops: cache slots of drafts and verify windows, the EAGLE tree's construction and
greedy verification, NGRAM's tree metadata from its mask, and the accept/bonus gathers.

Each follows the reference SGLang gives for it (its Triton kernels in ``kernels/ops/speculative/`` and the
contract in ``reconstruct_tree.py``'s docstring), written as plain loops or tensor ops: the trees are a few nodes
wide, and clarity is what a reference implementation is for."""

from __future__ import annotations

import torch

# tree_mask_mode values of SGLang's TreeMaskMode
FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2


def _segments(start_offset: torch.Tensor, end_offset: torch.Tensor) -> list[tuple[int, int, int]]:
    """(start, end, offset into the packed output) per request: request i's slots follow those of 0..i-1."""
    spans, out = [], 0
    for start, end in zip(start_offset.tolist(), end_offset.tolist(), strict=False):
        spans.append((start, end, out))
        out += max(end - start, 0)
    return spans


def assign_extend_cache_locs(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                             start_offset: torch.Tensor, end_offset: torch.Tensor, out_cache_loc: torch.Tensor,
                             pool_len: int) -> None:
    """The read direction of ``assign_req_to_token_pool``: request i's table slice ``[start[i], end[i])`` is packed
    into ``out_cache_loc`` after the slices of the requests before it."""
    del pool_len
    for row, (start, end, out) in zip(req_pool_indices.tolist(), _segments(start_offset, end_offset), strict=False):
        if end > start:
            out_cache_loc[out:out + end - start] = req_to_token[row, start:end].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                       seq_lens: torch.Tensor, out_cache_loc: torch.Tensor, pool_len: int,
                                       topk: int, speculative_num_steps: int) -> None:
    """Request i's ``topk * speculative_num_steps`` draft slots, read from its table row from ``seq_lens[i]`` on,
    go to ``out_cache_loc[i * width:(i + 1) * width]``."""
    del pool_len
    width = topk * speculative_num_steps
    for i, (row, start) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=False)):
        out_cache_loc[i * width:(i + 1) * width] = req_to_token[row, start:start + width].to(out_cache_loc.dtype)


def fill_accept_out_cache_loc(accept_index: torch.Tensor, out_cache_loc: torch.Tensor,
                              accept_out_cache_loc: torch.Tensor) -> None:
    """The cache slots of the accepted tokens, packed: entry p of the flattened ``accept_index`` lands after the
    entries before it that are not -1 (padding), and is written when it names a slot."""
    flat = accept_index.reshape(-1).to(torch.int64)
    counted = (flat != -1).to(torch.int64)
    dst = torch.cumsum(counted, 0) - counted
    keep = flat > -1
    accept_out_cache_loc[dst[keep]] = out_cache_loc[flat[keep]].to(accept_out_cache_loc.dtype)


def fill_bonus_tokens(accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor,
                      accept_stride: int) -> None:
    """Request i's bonus token is its last accepted one: ``accept_tokens`` (``accept_stride`` per request) at
    ``accept_lens[i] - 1``."""
    rows = torch.arange(accept_lens.numel(), dtype=torch.int64)
    picked = accept_tokens.reshape(-1)[rows * accept_stride + accept_lens.to(torch.int64) - 1]
    bonus_tokens.copy_(picked.to(bonus_tokens.dtype))


def _find(selected: list[int], token: int, width: int) -> int:
    """The first draft position (0-based, below ``width``) whose selected index is ``token``, else -1."""
    for pos in range(width):
        if selected[pos] == token:
            return pos
    return -1


def _link_children(parents: list[int], selected: list[int], topk: int, n: int,
                   next_token: torch.Tensor, next_sibling: torch.Tensor) -> None:
    """Tree node i (1..n-1) hangs under the node holding its parent; walking i downwards makes each node's first
    child the lowest-numbered one and chains the rest as siblings."""
    for i in range(n - 1, 0, -1):
        parent_slot = selected[i - 1] // topk
        if parent_slot == 0:
            parent_node = 0
        else:
            pos = _find(selected, parents[parent_slot], n - 1)
            if pos < 0:
                continue
            parent_node = pos + 1
        previous = int(next_token[parent_node])
        next_token[parent_node] = i
        if previous != -1:
            next_sibling[i] = previous


def _path_of(node: int, parents: list[int], selected: list[int], topk: int, n: int, depth: int) -> list[int]:
    """Draft positions (0-based) on the path from ``node`` up to the root, ``node``'s own first, at most
    ``depth`` of them."""
    path, cur = [], node - 1
    for _ in range(depth):
        path.append(cur)
        parent_slot = selected[cur] // topk
        if parent_slot == 0:
            break
        cur = _find(selected, parents[parent_slot], n - 1)
        if cur < 0:
            break
    return path


def _mask_row_start(mode: int, b: int, x: int, n: int, seq_len: int, prefix: int) -> int:
    """Where node x's mask row of batch b starts (the root's column): FULL_MASK rows span the verified prefix
    and the tree; QLEN_ONLY rows span the tree only."""
    if mode == FULL_MASK:
        return n * n * b + prefix * n + (seq_len + n) * x + seq_len
    return n * n * b + n * x


def build_tree_kernel_efficient(parent_list: torch.Tensor, selected_index: torch.Tensor,
                                verified_seq_len: torch.Tensor, tree_mask: torch.Tensor, positions: torch.Tensor,
                                retrive_index: torch.Tensor, retrive_next_token: torch.Tensor,
                                retrive_next_sibling: torch.Tensor, topk: int, depth: int, draft_token_num: int,
                                tree_mask_mode: int) -> None:
    """EAGLE's draft tree from the top-k search: ``selected_index[b, p]`` names draft p's slot in the search,
    whose parent slot is ``// topk`` and whose parent token is ``parent_list[b, slot]``. Writes each node's
    position (verified length + depth in the tree), its mask row (itself, its ancestors, the root; the
    verified prefix of a FULL_MASK row is the caller's), and the retrieve arrays (flat index, first child,
    next sibling; the caller fills the last two with -1)."""
    if tree_mask_mode == QLEN_ONLY_BITPACKING:
        raise NotImplementedError("tree_mask_mode QLEN_ONLY_BITPACKING: SGLang on CPU builds QLEN_ONLY masks")
    n, bs = draft_token_num, verified_seq_len.shape[0]
    seq_lens = verified_seq_len.tolist()
    parent_rows = parent_list.reshape(bs, -1).tolist()
    selected_rows = selected_index.reshape(bs, -1).tolist()
    flat_mask, flat_positions = tree_mask.view(-1), positions.view(-1)
    prefix = 0
    for b in range(bs):
        parents, selected, seq_len = parent_rows[b], selected_rows[b], int(seq_lens[b])
        retrive_index[b] = torch.arange(b * n, (b + 1) * n, dtype=retrive_index.dtype)
        _link_children(parents, selected, topk, n, retrive_next_token[b], retrive_next_sibling[b])
        for x in range(n):
            start = _mask_row_start(tree_mask_mode, b, x, n, seq_len, prefix)
            flat_mask[start:start + n] = False
            flat_mask[start] = True
            path = _path_of(x, parents, selected, topk, n, depth) if x else []
            for pos in path:
                flat_mask[start + 1 + pos] = True
            flat_positions[b * n + x] = seq_len + len(path)
        prefix += seq_len


def verify_tree_greedy(predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor,
                       candidates: torch.Tensor, retrive_index: torch.Tensor, retrive_next_token: torch.Tensor,
                       retrive_next_sibling: torch.Tensor, target_predict: torch.Tensor) -> None:
    """Greedy acceptance down the tree: from the root, among the current node's children (first child, then
    siblings) accept the first whose draft token equals the target's prediction at the last accepted node;
    stop when none does or ``accept_index`` (root + accepted drafts) is full. ``predicts`` gets the target's
    token at every accepted node (the last one's is the bonus), ``accept_index`` the accepted nodes' flat indices
    and ``accept_token_num`` how many drafts were accepted."""
    bs, n = candidates.shape
    slots = accept_index.shape[1]
    targets = target_predict.reshape(-1).tolist()
    for b in range(bs):
        index, cand = retrive_index[b].tolist(), candidates[b].tolist()
        first_child, sibling = retrive_next_token[b].tolist(), retrive_next_sibling[b].tolist()
        last, node, accepted = index[0], 0, 0
        accept_index[b, 0] = last
        for _ in range(1, slots):
            child = first_child[node]
            while child != -1 and cand[child] != targets[last]:
                child = sibling[child]
            if child == -1:
                break
            predicts[last] = targets[last]
            accepted += 1
            accept_index[b, accepted] = index[child]
            last, node = index[child], child
        accept_token_num[b] = accepted
        predicts[last] = targets[last]


def reconstruct_indices_from_tree_mask(tree_mask: torch.Tensor, verified_seq_len: torch.Tensor,
                                       positions: torch.Tensor, retrieve_index: torch.Tensor,
                                       retrieve_next_token: torch.Tensor, retrieve_next_sibling: torch.Tensor,
                                       batch_size: int, draft_token_num: int) -> None:
    """NGRAM's verify metadata from its ``[b, i, j]`` tree mask (j an ancestor of i when j < i): position =
    verified length + number of ancestors; parent = nearest ancestor; first child = lowest-numbered node having
    this one as an ancestor; next sibling = next higher-numbered node with the same parent (none for the root)."""
    n, bs = draft_token_num, batch_size
    if bs == 0:
        return
    nodes = torch.arange(n)
    ancestors = tree_mask.reshape(-1)[:bs * n * n].view(bs, n, n).bool() & (nodes[None, :] < nodes[:, None])
    positions.view(-1)[:bs * n] = (ancestors.sum(-1) + verified_seq_len.view(bs, 1)).reshape(-1).to(positions.dtype)
    retrieve_index.view(bs, n)[:] = (torch.arange(bs)[:, None] * n + nodes).to(retrieve_index.dtype)
    none = torch.full((bs, n), -1, dtype=torch.int64)
    parent = torch.where(ancestors.any(-1), torch.where(ancestors, nodes, -1).amax(-1), none)
    # children[b, t, k]: node t is an ancestor of k, so the lowest such k is t's first child
    first_child = torch.where(ancestors.transpose(1, 2), nodes, n).amin(-1)
    retrieve_next_token.view(bs, n)[:] = torch.where(first_child < n, first_child, none).to(retrieve_next_token.dtype)
    later_kin = (parent[:, None, :] == parent[:, :, None]) & (nodes[None, :] > nodes[:, None])
    sibling = torch.where(later_kin, nodes, n).amin(-1)
    sibling = torch.where((sibling < n) & (parent >= 0), sibling, none)
    retrieve_next_sibling.view(bs, n)[:] = sibling.to(retrieve_next_sibling.dtype)
