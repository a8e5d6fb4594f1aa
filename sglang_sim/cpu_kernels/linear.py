"""SGLang's CPU linear layers: ``convert_weight_packed`` once per weight when the model loads, then
``weight_packed_linear`` per call (``layers/quantization/unquant.py``, ``UnquantizedLinearMethod``), as on a Xeon
with AMX.

The C++ kernel multiplies bf16 by bf16 in tiles with float32 sums and rounds the result to bf16. Here the weight is
kept as float32 (every bf16 value is exact in float32) and the rows go through torch's float32 GEMM, which is 6-8
times faster on a CPU without AMX than its bf16 one. Rows go ``ROWS`` at a time, the last block padded with zeros:
every call is then the same GEMM shape, so a row's sums, and its bits, do not depend on how many other rows share
the batch (a token verified among drafts equals the token decoded alone). A GEMM of another shape may choose
another kernel and another order of sums."""

from __future__ import annotations

import torch

ROWS = 16


def convert_weight_packed(weight: torch.Tensor) -> torch.Tensor:
    """``[out, in]`` bf16 -> ``[in, out]`` float32, the layout ``torch.mm`` reads without a copy."""
    return weight.float().t().contiguous()


def weight_packed_linear(mat1: torch.Tensor, mat2: torch.Tensor, bias: torch.Tensor | None,
                         is_vnni: bool) -> torch.Tensor:
    """``mat1 [m, in]`` times the packed ``mat2``, plus ``bias``, in ``mat1``'s dtype."""
    del is_vnni  # the C++ kernel's packing flag: this layout is always the one above
    rows = mat1.float()
    m = rows.shape[0]
    padded = -(-m // ROWS) * ROWS
    if padded != m:
        rows = torch.cat([rows, rows.new_zeros(padded - m, rows.shape[1])])
    out = rows.new_empty(padded, mat2.shape[1])
    for start in range(0, padded, ROWS):
        torch.mm(rows[start:start + ROWS], mat2, out=out[start:start + ROWS])
    if bias is not None:
        out += bias.float()
    return out[:m].to(mat1.dtype)
