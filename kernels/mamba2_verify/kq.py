"""Mamba-2 verify, ``kq_prep`` launch option: ``KᵀQ`` once per (row, group), before the verify.

``KᵀQ [BLOCK_J, BLOCK_T]`` (``B_j·C_s`` over the record index space ``J`` of ``fma.py``: the
``T`` window tokens, then the committed history newest first, none for flush rows) depends on the
row and the head's group, not on the head; the FMA verify kernel forms it once per (row, head),
so a group of ``H / G`` heads (12 in Nemotron-3-Nano-4B) computes it ``H / G`` times: about 1,000
of a non-flush program's ~4,800 instructions at T = 4 (benchmarks/notes/verify.md, offline
sm_90a). With ``kq_prep = 1`` (``LaunchConfig``; FMA implementation, ``kq_dot = 0``) this launch
(grid ``(G, batch)``) forms it once per (row, group) with the verify kernel's own expressions
(``tl.sum`` of fp32 products over ``BLOCK_K``-column chunks of N, one column per window token) and
stores it into a scratch tensor ``kq [batch, G, BLOCK_J, BLOCK_T]`` fp32, which the verify kernel
loads instead; it also appends the window's ``B`` records (from the same loads), which the verify
kernel then skips. Outputs only (the checkpoint fold never uses ``KᵀQ``): the appended records
are the same bits, outputs may differ from the in-kernel ``KᵀQ`` by the sums' reduction order.

Padding rows (``slot < 0``) return before touching memory (their ``kq`` rows stay unwritten and
are never read). No autotune, no host sync: CUDA-graph safe.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["mamba2_verify_kq_kernel"]


@triton.jit
def mamba2_verify_kq_kernel(
    ring_B_ptr, B_ptr, C_ptr, kq_ptr, slot_idx_ptr, ring_start_ptr, ring_len_ptr, flush_ptr,
    T, N, R,
    stride_rB_slot, stride_rB_group, stride_rB_row, stride_rB_n,
    stride_B_batch, stride_B_T, stride_B_group, stride_B_n,
    stride_C_batch, stride_C_T, stride_C_group, stride_C_n,
    stride_kq_batch, stride_kq_group, stride_kq_j, stride_kq_t,
    BLOCK_J: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program ``(g, b)``: row ``b``'s ``KᵀQ`` of group ``g`` into ``kq[b, g]`` and its window
    ``B`` records into ``ring_B[slot, g]`` at physical rows ``(start + len + t) % R``."""
    i_g = tl.program_id(0)
    i_b = tl.program_id(1)
    slot = tl.load(slot_idx_ptr + i_b).to(tl.int64)
    start = tl.load(ring_start_ptr + i_b).to(tl.int32)
    length = tl.load(ring_len_ptr + i_b).to(tl.int32)
    do_flush = tl.load(flush_ptr + i_b)
    if slot < 0:
        return
    i_b64 = i_b.to(tl.int64)
    hist = tl.where(do_flush, 0, length)
    o_j = tl.arange(0, BLOCK_J)
    o_t = tl.arange(0, BLOCK_T)
    is_w = o_j < T
    is_h = (o_j >= T) & (o_j < T + hist)
    row_j = (start + tl.where(is_h, hist - 1 - (o_j - T), 0)) % R
    row_w = (start + length + o_j) % R
    p_rB_grp = ring_B_ptr + slot * stride_rB_slot + i_g * stride_rB_group
    p_B_row = B_ptr + i_b64 * stride_B_batch + i_g * stride_B_group
    p_C_row = C_ptr + i_b64 * stride_C_batch + i_g * stride_C_group
    o_k = tl.arange(0, BLOCK_K)
    kq = tl.zeros([BLOCK_J, BLOCK_T], dtype=tl.float32)
    NUM_KC: tl.constexpr = (BLOCK_N + BLOCK_K - 1) // BLOCK_K
    for kc in tl.static_range(NUM_KC):
        o_nk = kc * BLOCK_K + o_k
        m_nk = o_nk < N
        p_Bj = tl.where(is_w[:, None], p_B_row + o_j[:, None] * stride_B_T
                        + o_nk[None, :] * stride_B_n,
                        p_rB_grp + row_j[:, None] * stride_rB_row + o_nk[None, :] * stride_rB_n)
        b_Bj = tl.load(p_Bj, mask=(is_w | is_h)[:, None] & m_nk[None, :], other=0.0)
        b_Bf = b_Bj.to(tl.float32)
        for s in tl.static_range(BLOCK_T):
            b_c = tl.load(p_C_row + s * stride_C_T + o_nk * stride_C_n, mask=m_nk & (s < T),
                          other=0.0).to(tl.float32)
            kq += tl.where(o_t[None, :] == s, tl.sum(b_Bf * b_c[None, :], axis=1)[:, None], 0.0)
        tl.store(p_rB_grp + row_w[:, None] * stride_rB_row + o_nk[None, :] * stride_rB_n, b_Bj,
                 mask=is_w[:, None] & m_nk[None, :])
    tl.store(kq_ptr + i_b64 * stride_kq_batch + i_g * stride_kq_group
             + o_j[:, None] * stride_kq_j + o_t[None, :] * stride_kq_t, kq)
