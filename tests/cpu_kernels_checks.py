"""Checks of ``dspark_ci.sglang_sim.cpu_kernels``'s ops, run by tests/test_cpu_kernels.py in SGLang's interpreter (it
has torch; ours does not): ``python tests/cpu_kernels_checks.py`` prints one JSON line per check, ``{"check": name,
"error": null | traceback}``.

Every op goes through ``torch.ops.sgl_kernel`` as SGLang calls it, after ``import sgl_kernel`` from the boot
directory, and is compared with a plain reference written here: loops over small tensors (tree masks, padding,
-1 slots) and, for attention, a dense softmax over every key of every head."""

from __future__ import annotations

import json
import math
import sys
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "sglang_sim" / "cpu_kernels" / "boot"), str(REPO)]

import sgl_kernel  # noqa: E402  (the boot directory's package registers the ops)
import sgl_kernel.speculative  # noqa: E402
import torch  # noqa: E402

ops = torch.ops.sgl_kernel
I32, I64 = torch.int32, torch.int64


def t(values, dtype=I64):
    return torch.tensor(values, dtype=dtype)


# ---- the request-to-token table and cache slots ----

def check_assign_req_to_token_pool_writes_each_requests_slice():
    table = torch.full((4, 10), -1, dtype=I32)
    # request 0 -> row 2, positions 3..5; request 1 -> row 0, nothing (padding); request 2 -> row 3, 0..2
    ops.assign_req_to_token_pool_cpu(t([2, 0, 3]), table, t([3, 4, 0]), t([6, 4, 2]), t([7, 8, 9, 40, 41]), 10)
    expected = torch.full((4, 10), -1, dtype=I32)
    expected[2, 3:6] = t([7, 8, 9], I32)
    expected[3, 0:2] = t([40, 41], I32)
    assert torch.equal(table, expected), table


def check_assign_extend_cache_locs_reads_back_what_was_written():
    table = torch.arange(40, dtype=I32).view(4, 10)
    out = torch.full((5,), -7, dtype=I64)
    ops.assign_extend_cache_locs_cpu(t([1, 3]), table, t([2, 8]), t([5, 10]), out, 10)
    assert out.tolist() == [12, 13, 14, 38, 39], out
    # and SGLang's front-window use: a [bs, w] window as the table, starts 0, ends num_front, int64 output
    window = t([[5, 6, 7], [8, 9, 10]]).int()
    front = torch.full((3,), -1, dtype=I64)
    ops.assign_extend_cache_locs_cpu(t([0, 1]), window, t([0, 0]), t([2, 1]), front, 3)
    assert front.tolist() == [5, 6, 8], front


def check_assign_draft_cache_locs_contiguous():
    table = torch.arange(60, dtype=I32).view(3, 20)
    topk, steps = 2, 3
    out = torch.zeros(2 * topk * steps, dtype=I64)
    ops.assign_draft_cache_locs_contiguous_cpu(t([2, 0]), table, t([4, 10]), out, 20, topk, steps)
    assert out.tolist() == list(range(44, 50)) + list(range(10, 16)), out


def check_copy_all_layer_kv_cache_moves_rows_in_every_layer_gather_first():
    layers = [torch.arange(8 * 6, dtype=torch.bfloat16).view(8, 2, 3) + 100 * n for n in range(3)]
    before = [x.clone() for x in layers]
    ptrs = torch.tensor([x.data_ptr() for x in layers], dtype=torch.uint64)
    strides = torch.tensor([x.stride(0) * x.element_size() for x in layers])
    # overlapping move: 1<-0, 2<-1, 5<-7 (a target that is also a source reads its old row)
    ops.copy_all_layer_kv_cache_cpu(ptrs, strides, t([1, 2, 5]), t([0, 1, 7]))
    for x, old in zip(layers, before, strict=False):
        want = old.clone()
        for tgt, src in ((1, 0), (2, 1), (5, 7)):
            want[tgt] = old[src]
        assert torch.equal(x, want)
    ops.copy_all_layer_kv_cache_cpu(ptrs, strides, t([]), t([]))  # nothing to move


def check_fill_accept_out_cache_loc_skips_minus_one_padding():
    accept_index = t([[0, 2, -1], [4, -1, -1], [6, 7, 8]], I32)
    out_cache_loc = t([100 + i for i in range(9)])
    got = torch.full((8,), -5, dtype=I64)
    ops.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, got)
    assert got.tolist() == [100, 102, 104, 106, 107, 108, -5, -5], got


def check_fill_bonus_tokens_takes_each_requests_last_accepted():
    accept_tokens = t([[11, 12, 13], [21, 22, 23], [31, 32, 33]], I32)
    bonus = torch.zeros(3, dtype=I32)
    ops.fill_bonus_tokens_cpu(accept_tokens, t([2, 1, 3], I32), bonus, 3)
    assert bonus.tolist() == [12, 21, 33], bonus


# ---- trees ----

def reference_tree(mask):
    """(parent, first child, next sibling, depth) of an n x n ancestor mask, by plain loops."""
    n = len(mask)
    parent = [max([j for j in range(i) if mask[i][j]], default=-1) for i in range(n)]
    child = [next((k for k in range(i + 1, n) if parent[k] == i), -1) for i in range(n)]
    sibling = [-1 if parent[i] < 0 else next((k for k in range(i + 1, n) if parent[k] == parent[i]), -1)
               for i in range(n)]
    depth = [sum(1 for j in range(i) if mask[i][j]) for i in range(n)]
    return parent, child, sibling, depth


NGRAM_MASK = [  # 0 root; 1,2 children of 0; 3 child of 1; 4 child of 3; 5 child of 2; 6 child of 0
    [1, 0, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0, 0],
    [1, 0, 1, 0, 0, 0, 0],
    [1, 1, 0, 1, 0, 0, 0],
    [1, 1, 0, 1, 1, 0, 0],
    [1, 0, 1, 0, 0, 1, 0],
    [1, 0, 0, 0, 0, 0, 1],
]


def check_reconstruct_indices_from_tree_mask_against_loops():
    n, chain = 7, [[1 if j <= i else 0 for j in range(7)] for i in range(7)]
    masks = [NGRAM_MASK, chain]
    seq = t([5, 9])
    positions, index = torch.zeros(2 * n, dtype=I64), torch.zeros(2, n, dtype=I64)
    nxt, sib = torch.zeros(2, n, dtype=I64), torch.zeros(2, n, dtype=I64)
    tree_mask = torch.tensor(masks, dtype=torch.bool).flatten()
    sgl_kernel.speculative.reconstruct_indices_from_tree_mask(tree_mask, seq, positions, index, nxt, sib, 2, n)
    for b, mask in enumerate(masks):
        _, child, sibling, depth = reference_tree(mask)
        assert positions[b * n:(b + 1) * n].tolist() == [int(seq[b]) + d for d in depth]
        assert index[b].tolist() == [b * n + i for i in range(n)]
        assert nxt[b].tolist() == child, (b, nxt[b], child)
        assert sib[b].tolist() == sibling, (b, sib[b], sibling)
    assert nxt[0].tolist() == [1, 3, 5, 4, -1, -1, -1] and sib[0].tolist() == [-1, 2, 6, -1, -1, -1, -1]


def eagle_tree_inputs():
    """A top-2, depth-2 search for 2 requests: draft p's slot ``selected[p]``, parent slot ``selected // topk``
    (0 = the root), parent token = ``parents[slot]``."""
    topk, depth, n = 2, 2, 5
    # slots 1..2: first step's candidates (parent slot 0 = root); slots 3..6: second step's, children of the
    # first step's selected index 1 (slots 2,3 -> parent parents[1]) or of index 2 (slots 4,5 -> parents[2])
    parents = t([[-1, 0, 1], [-1, 1, 0]])
    selected = t([[0, 1, 4, 2], [1, 0, 5, 3]])
    return parents, selected, topk, depth, n


def check_build_tree_matches_its_mask_read_back():
    parents, selected, topk, depth, n = eagle_tree_inputs()
    bs, seq = 2, t([3, 6])
    mask = torch.ones(bs * n * n, dtype=torch.bool)
    positions = torch.zeros(bs * n, dtype=I64)
    index, nxt, sib = (torch.full((bs, n), -1, dtype=I64) for _ in range(3))
    ops.build_tree_kernel_efficient_cpu(parents, selected, seq, mask, positions, index, nxt, sib,
                                        topk, depth, n, 1)
    rows = mask.view(bs, n, n).int().tolist()
    # request 0: drafts 0,1 (slots 0,1 -> root's children), 2 (slot 4 -> parent token parents[2]=1 = draft 1),
    # 3 (slot 2 -> parent token parents[1]=0 = draft 0)
    assert rows[0] == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 0, 1, 1, 0], [1, 1, 0, 0, 1]], rows[0]
    # the NGRAM reconstruction of the same mask gives the same positions and links
    positions2, index2 = torch.zeros(bs * n, dtype=I64), torch.zeros(bs, n, dtype=I64)
    nxt2, sib2 = torch.zeros(bs, n, dtype=I64), torch.zeros(bs, n, dtype=I64)
    ops.reconstruct_indices_from_tree_mask(mask, seq, positions2, index2, nxt2, sib2, bs, n)
    assert torch.equal(positions, positions2) and torch.equal(index, index2), (positions, positions2)
    assert torch.equal(nxt, nxt2) and torch.equal(sib, sib2), (nxt, nxt2, sib, sib2)


def check_build_tree_full_mask_leaves_the_prefix_to_the_caller():
    parents, selected, topk, depth, n = eagle_tree_inputs()
    bs, seq = 2, t([3, 6])
    qlen = torch.ones(bs * n * n, dtype=torch.bool)
    full = torch.ones(int(seq.sum()) * n + bs * n * n, dtype=torch.bool)
    outs = [[torch.zeros(bs * n, dtype=I64)] + [torch.full((bs, n), -1, dtype=I64) for _ in range(3)]
            for _ in range(2)]
    ops.build_tree_kernel_efficient_cpu(parents, selected, seq, qlen, *outs[0], topk, depth, n, 1)
    ops.build_tree_kernel_efficient_cpu(parents, selected, seq, full, *outs[1], topk, depth, n, 0)
    at = 0
    for b, s in enumerate(seq.tolist()):
        block = full[at:at + n * (s + n)].view(n, s + n)
        assert bool(block[:, :s].all()), "prefix columns are the caller's (all True)"
        assert torch.equal(block[:, s:], qlen.view(bs, n, n)[b])
        at += n * (s + n)
    assert all(torch.equal(x, y) for x, y in zip(*outs, strict=False))


def reference_verify(mask, candidates, target):
    """Greedy walk: from the root, the lowest-numbered child whose token is the target's prediction at the
    current node; returns (accepted nodes after the root, the node the walk ended on)."""
    parent, _, _, _ = reference_tree(mask)
    node, path = 0, []
    while True:
        kids = [k for k in range(len(mask)) if parent[k] == node and candidates[k] == target[node]]
        if not kids:
            return path, node
        node = kids[0]
        path.append(node)


def check_verify_tree_greedy_against_a_walk():
    n, bs = 7, 3
    masks = [NGRAM_MASK] * bs
    candidates = t([[50, 60, 70, 61, 62, 71, 80],  # 60 then 61 then 62: the full path 0-1-3-4
                    [50, 70, 70, 61, 62, 71, 80],  # 1 misses, its sibling 2 (70) hits, then 5 (71)
                    [50, 99, 98, 61, 62, 71, 97]], I32)  # nothing matches: only the bonus
    target = t([[60, 61, 71, 62, 63, 72, 81],
                [70, 61, 71, 62, 63, 72, 81],
                [60, 61, 71, 62, 63, 72, 81]], I32)
    seq = t([4, 4, 4])
    positions, index = torch.zeros(bs * n, dtype=I64), torch.zeros(bs, n, dtype=I64)
    nxt, sib = torch.zeros(bs, n, dtype=I64), torch.zeros(bs, n, dtype=I64)
    ops.reconstruct_indices_from_tree_mask(torch.tensor(masks, dtype=torch.bool).flatten(), seq, positions,
                                           index, nxt, sib, bs, n)
    for slots in (4, 3):  # 3 slots cut the first request's path after two drafts
        predicts = torch.full((bs * n,), -1, dtype=I32)
        accept_index = torch.full((bs, slots), -1, dtype=I32)
        accept_num = torch.zeros(bs, dtype=I32)
        ops.verify_tree_greedy_cpu(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
                                   candidates=candidates, retrive_index=index, retrive_next_token=nxt,
                                   retrive_next_sibling=sib, target_predict=target)
        for b in range(bs):
            path, _ = reference_verify(masks[b], candidates[b].tolist(), target[b].tolist())
            path = path[:slots - 1]
            nodes = [0] + path
            assert accept_num[b] == len(path), (b, accept_num, path)
            assert accept_index[b].tolist() == [b * n + k for k in nodes] + [-1] * (slots - len(nodes))
            for k in range(n):
                want = int(target[b, k]) if k in nodes else -1
                assert int(predicts[b * n + k]) == want, (b, k, predicts)
    assert accept_num.tolist() == [2, 2, 0]


# ---- attention ----

def dense_reference(q, keys, values, visible, scale, cap=0.0, sink=None):
    """softmax(q k^T * scale [capped], masked) v per head, by loops; [t, H, Dv] float64."""
    heads, kv_heads = q.shape[1], keys.shape[1]
    out = torch.zeros(q.shape[0], heads, values.shape[2], dtype=torch.float64)
    for h in range(heads):
        kh = h // (heads // kv_heads)
        for i in range(q.shape[0]):
            logits = []
            for j in range(keys.shape[0]):
                s = float(q[i, h].double() @ keys[j, kh].double()) * scale
                logits.append(cap * math.tanh(s / cap) if cap > 0 else s)
            live = [j for j in range(keys.shape[0]) if visible[i][j]]
            top = max([logits[j] for j in live] + ([float(sink[h])] if sink is not None else []))
            weights = {j: math.exp(logits[j] - top) for j in live}
            total = sum(weights.values()) + (math.exp(float(sink[h]) - top) if sink is not None else 0.0)
            for j, w in weights.items():
                out[i, h] += w / total * values[j, kh].double()
    return out


def kv_pool(slots, kv_heads, dim, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(slots, kv_heads, dim, generator=g).bfloat16(),
            torch.randn(slots, kv_heads, dim, generator=g).bfloat16())


def close(got, want):
    err = (got.double() - want).abs().max().item()
    assert err < 2e-2, f"max abs error {err}"


def check_decode_attention_writes_the_new_kv_and_matches_dense_softmax():
    heads, kv_heads, dim, slots = 4, 2, 16, 64
    k_buf, v_buf = kv_pool(slots, kv_heads, dim, 1)
    table = torch.zeros(3, 32, dtype=I32)
    table[2, :7] = t([9, 3, 40, 41, 17, 5, 60], I32)  # request 0: 7 tokens, the last (slot 60) new
    table[0, :3] = t([11, 12, 63], I32)  # request 1: 3 tokens, the last (slot 63) new
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, heads, dim, generator=g).bfloat16()
    new_k = torch.randn(2, kv_heads, dim, generator=g).bfloat16()
    new_v = torch.randn(2, kv_heads, dim, generator=g).bfloat16()
    for cap, sink in ((0.0, None), (3.0, None), (0.0, torch.tensor([0.5, -1.0, 2.0, 0.0]))):
        out = torch.zeros(2, heads, dim, dtype=torch.bfloat16)
        logits = torch.zeros(2, heads, 8, dim + 1)
        ops.decode_attention_cpu(q, k_buf, v_buf, 1.0, 1.0, out, new_k, new_v, t([60, 63]), logits, table,
                                 t([2, 0]), t([7, 3]), 0.25, cap, False, 0, None, sink)
        assert torch.equal(k_buf[60], new_k[0]) and torch.equal(v_buf[63], new_v[1])
        for i, (row, n) in enumerate(((2, 7), (0, 3))):
            s = table[row, :n].long()
            want = dense_reference(q[i:i + 1], k_buf[s], v_buf[s], [[True] * n], 0.25, cap, sink)
            close(out[i:i + 1], want)
    # a sliding window of 3 sees only the last 3 tokens
    out = torch.zeros(2, heads, dim, dtype=torch.bfloat16)
    ops.decode_attention_cpu(q, k_buf, v_buf, 1.0, 1.0, out, None, None, t([60, 63]), logits, table,
                             t([2, 0]), t([7, 3]), 0.25, 0.0, False, 3, None, None)
    s = table[2, :7].long()
    close(out[0:1], dense_reference(q[0:1], k_buf[s], v_buf[s], [[j >= 4 for j in range(7)]], 0.25))


def check_extend_attention_with_a_prefix_is_causal_over_the_new_tokens():
    heads, kv_heads, dim, slots = 4, 2, 8, 64
    k_buf, v_buf = kv_pool(slots, kv_heads, dim, 3)
    table = torch.zeros(2, 16, dtype=I32)
    table[1, :9] = torch.arange(20, 29, dtype=I32)  # request 0: prefix 5, extend 4
    table[0, :3] = torch.arange(40, 43, dtype=I32)  # request 1: no prefix, extend 3
    g = torch.Generator().manual_seed(4)
    q = torch.randn(7, heads, dim, generator=g).bfloat16()
    k_new, v_new = k_buf[t(list(range(25, 29)) + [40, 41, 42])], v_buf[t(list(range(25, 29)) + [40, 41, 42])]
    out = torch.zeros(7, heads, dim, dtype=torch.bfloat16)
    ops.extend_attention_cpu(q, k_new, v_new, out, k_buf, v_buf, 1.0, 1.0, table, t([1, 0]), t([9, 3]),
                             t([4, 3], I32), t([0, 4], I32), 4, 0.3, 0.0, False, 0, None, None, None, True)
    for (row, n, e, start) in ((1, 9, 4, 0), (0, 3, 3, 4)):
        s = table[row, :n].long()
        visible = [[j <= n - e + i for j in range(n)] for i in range(e)]
        close(out[start:start + e], dense_reference(q[start:start + e], k_buf[s], v_buf[s], visible, 0.3))
    # k/v None (a layer sharing another's cache) reads the extend tokens from the cache: same result
    again = torch.zeros_like(out)
    ops.extend_attention_cpu(q, None, None, again, k_buf, v_buf, 1.0, 1.0, table, t([1, 0]), t([9, 3]),
                             t([4, 3], I32), t([0, 4], I32), 4, 0.3, 0.0, False, 0, None, None, None, True)
    assert torch.equal(out, again)


def check_verify_attention_applies_the_tree_mask():
    heads, kv_heads, dim, slots, n = 4, 2, 8, 64, 7
    k_buf, v_buf = kv_pool(slots, kv_heads, dim, 5)
    table = torch.zeros(2, 32, dtype=I32)
    table[0, :5 + n] = torch.arange(0, 5 + n, dtype=I32)  # request 0: prefix 5, the NGRAM tree
    table[1, :2 + n] = torch.arange(30, 32 + n, dtype=I32)  # request 1: prefix 2, a chain
    chain = [[1 if j <= i else 0 for j in range(n)] for i in range(n)]
    mask = torch.tensor([NGRAM_MASK, chain], dtype=torch.bool).flatten()
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2 * n, heads, dim, generator=g).bfloat16()
    out = torch.zeros(2 * n, heads, dim, dtype=torch.bfloat16)
    new = t(list(range(5, 5 + n)) + list(range(32, 32 + n)))
    ops.extend_attention_cpu(q, k_buf[new], v_buf[new], out, k_buf, v_buf, 1.0, 1.0, table, t([0, 1]),
                             t([5 + n, 2 + n]), t([n, n], I32), t([0, n], I32), n, 0.35, 0.0, False, 0, None,
                             None, mask, True)
    for b, (prefix, tree) in enumerate(((5, NGRAM_MASK), (2, chain))):
        s = table[b, :prefix + n].long()
        visible = [[True] * prefix + [bool(x) for x in tree[i]] for i in range(n)]
        close(out[b * n:(b + 1) * n], dense_reference(q[b * n:(b + 1) * n], k_buf[s], v_buf[s], visible, 0.35))
    # the mask matters: node 4 (path 0-1-3-4) must not see node 2
    unmasked = torch.zeros_like(out)
    ops.extend_attention_cpu(q, k_buf[new], v_buf[new], unmasked, k_buf, v_buf, 1.0, 1.0, table, t([0, 1]),
                             t([5 + n, 2 + n]), t([n, n], I32), t([0, n], I32), n, 0.35, 0.0, False, 0, None,
                             None, None, True)
    assert not torch.equal(out[4], unmasked[4])


def check_a_token_gets_the_same_bits_in_decode_and_in_verify():
    """Greedy parity between a speculative launch and a plain one is exact only if a token's attention is the
    same to the bit whichever path computes it: plain decode (one query, keys = the sequence so far) or verify
    (the token is a tree node; keys = the prefix and its ancestors)."""
    heads, kv_heads, dim, n, prefix = 4, 2, 16, 7, 9
    bad = 0
    for seed in range(40):
        k_buf, v_buf = kv_pool(64, kv_heads, dim, 100 + seed)
        q = torch.randn(n, heads, dim, generator=torch.Generator().manual_seed(seed)).bfloat16()
        table = torch.zeros(2, 32, dtype=I32)
        table[0, :prefix + n] = torch.arange(prefix + n, dtype=I32)
        verify = torch.zeros(n, heads, dim, dtype=torch.bfloat16)
        new = torch.arange(prefix, prefix + n)
        ops.extend_attention_cpu(q, k_buf[new], v_buf[new], verify, k_buf, v_buf, 1.0, 1.0, table, t([0]),
                                 t([prefix + n]), t([n], I32), t([0], I32), n, 0.25, 0.0, False, 0, None, None,
                                 torch.tensor(NGRAM_MASK, dtype=torch.bool).flatten(), True)
        for node in range(n):
            path = [j for j in range(n) if NGRAM_MASK[node][j]]  # the accepted tokens, in order
            table[1, :prefix + len(path)] = torch.tensor(list(range(prefix)) + [prefix + j for j in path], dtype=I32)
            decode = torch.zeros(1, heads, dim, dtype=torch.bfloat16)
            ops.decode_attention_cpu(q[node:node + 1], k_buf, v_buf, 1.0, 1.0, decode, None, None, t([0]),
                                     torch.zeros(1, heads, 8, dim + 1), table, t([1]), t([prefix + len(path)]),
                                     0.25, 0.0, False, 0, None, None)
            bad += not torch.equal(decode[0], verify[node])
    assert bad == 0, f"{bad} of {40 * n} tokens differ between decode and verify"


def check_build_draft_decode_metadata_lays_out_each_candidates_drafts():
    table = torch.arange(2 * 30, dtype=I32).view(2, 30)
    got = ops.build_draft_decode_metadata_cpu(table, t([1, 0]), t([4, 6]), 2, 3, 30)
    assert got.shape == (4, 30) and got.dtype == I32
    assert got[0, :7].tolist() == [30, 31, 32, 33, 34, 35, 36]  # request 0 (row 1), candidate 0: drafts 34..36
    assert got[1, :7].tolist() == [30, 31, 32, 33, 37, 38, 39]  # candidate 1: drafts 37..39
    assert got[3, :9].tolist() == [0, 1, 2, 3, 4, 5, 9, 10, 11]  # request 1 (row 0), candidate 1


# ---- linear layers ----

def bf16_steps(got, want):
    """How many bf16 steps apart two bf16 tensors are, elementwise (both finite)."""
    as_int = lambda x: x.contiguous().view(torch.int16).to(torch.int32)  # noqa: E731
    return (as_int(got) - as_int(want)).abs()


def packed_linear(x, weight, bias):
    packed = ops.convert_weight_packed(weight)
    return ops.weight_packed_linear(x, packed, bias, True)


def check_weight_packed_linear_is_x_times_w_transposed_plus_bias():
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(40, 24, generator=gen).bfloat16()
    bias = torch.randn(40, generator=gen).bfloat16()
    x = torch.randn(5, 24, generator=gen).bfloat16()
    got = packed_linear(x, weight, bias)
    want = (x.double() @ weight.double().t() + bias.double()).bfloat16()
    assert got.dtype == torch.bfloat16 and got.shape == (5, 40), (got.dtype, got.shape)
    # float32 sums in another order than float64's may land one bf16 step away, never more
    assert int(bf16_steps(got, want).max()) <= 1, bf16_steps(got, want).max()
    assert torch.equal(packed_linear(x, weight, None), packed_linear(x, weight, torch.zeros_like(bias)))


def check_a_rows_linear_bits_do_not_depend_on_its_batch():
    """A token verified among drafts must equal the token decoded alone, through every layer."""
    gen = torch.Generator().manual_seed(4)
    # the model's MLP shape: one torch.mm over all 300 rows gives row 7 other bits than alone
    weight = torch.randn(1536, 576, generator=gen).bfloat16()
    x = torch.randn(300, 576, generator=gen).bfloat16()
    whole = packed_linear(x, weight, None)
    for rows in (slice(0, 1), slice(7, 8), slice(3, 20), slice(32, 37), slice(100, 250)):
        assert torch.equal(packed_linear(x[rows], weight, None), whole[rows]), rows


def check_every_import_time_name_is_present():
    names = ["assign_req_to_token_pool_cpu", "copy_all_layer_kv_cache_cpu", "assign_draft_cache_locs_contiguous_cpu",
             "assign_extend_cache_locs_cpu", "build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu",
             "fill_accept_out_cache_loc_cpu", "fill_bonus_tokens_cpu", "build_draft_decode_metadata_cpu"]
    missing = [n for n in names if not callable(getattr(sgl_kernel, n, None))]
    assert not missing, missing
    assert callable(sgl_kernel.speculative.reconstruct_indices_from_tree_mask)
    for op in ("decode_attention_cpu", "extend_attention_cpu"):
        assert hasattr(ops, op), op
    # SGLang's linear layers pack their weights once the platform says AMX (boot/sitecustomize.py)
    for op in ("convert_weight_packed", "weight_packed_linear"):
        assert hasattr(ops, op), op


def main() -> int:
    checks = [(name, fn) for name, fn in globals().items() if name.startswith("check_")]
    for name, fn in checks:
        try:
            fn()
            error = None
        except Exception:
            error = traceback.format_exc()
        print(json.dumps({"check": name, "error": error}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
