"""The two row kinds of the GDN decode program, with every row sum laid out rows-on-lanes.

SGLang's packed decode (``fused_recurrent_gated_delta_rule_packed_decode_kernel``) reduces every
``[32, 128]`` row product ``S·k̂`` with ``tl.sum`` on its ``[1,4]×[1,32]`` tile layout (one warp):
each lane sums its 4 columns ``4c..4c+3`` in order (``((p0 + p1) + p2) + p3``, the first add fused
with ``p0``'s product), then the warp combines the 32 lane partials with butterfly shuffles,
xor 16, 8, 4, 2, 1.  The layout fixes that tree, and the tree fixes the bits.  On that layout a
record costs 160 shuffles per 32 rows (5 per row) and as many dependent adds, which made a fold
written the same way latency-bound (``benchmarks/notes/gdn_decode.md``).

``flush_tree`` (flush rows: the exact fold) computes the same tree with the pairings spelled out:
the tile is viewed as ``[RL, b0, b1, RH, b2, b3, b4, 4]`` (row = ``rh·RL + rl``, column =
``4·c + j`` with ``c = b0 + 2 b1 + 4 b2 + 8 b3 + 16 b4``), each row sum is ``tl.sum`` over ``j``
(the 4-column chain, in-thread), then over ``b4`` (``c`` with ``c ^ 16``: the xor-16 level),
``b3``, ``b2``, ``b1``, ``b0``: each level one add of the same two partials the butterfly adds
(fp32 addition is commutative, so which lane holds which operand does not matter).  The bits no
longer depend on where the data lives, so the compiler is free to put rows on lanes: Triton
assigns lanes to ``RL`` rows and the low chunk bits (``RL = 16``: lanes = 16 rows × ``b0``, each
lane 16 chunks of one or more rows), and the levels ``b4 .. b1`` become in-thread adds; one
shuffle per row and record remains (xor with the ``b0`` lane).  The norms of k and q are computed
exactly as in SGLang's kernel (1-D ``[4]×[32]`` layout, same code); ``pin`` then keeps the
normalised vectors' division in that layout before they are moved (an exact copy) to the tile's.
Everything else (decay, ``v −= S·k̂``, ``v *= β``, ``S += v k̂ᵀ``, ``y = S·q̃``, the store) is
SGLang's expressions, element for element.

``nonflush_rows`` (non-flush rows: the inner-product form, math.md §4) lays its sums out the same
way (``RL = 4`` rows on lanes); its outputs never feed a checkpoint, so their order is free.  A
program may own several of a head's value tiles (``TILES``): ``nonflush_rows`` then does the
per-key-head work once and the tiles in turn, flush rows call ``flush_tree`` once per tile.

Bitwise status: on the GPU the flushed checkpoint and the flush output equal SGLang's packed
decode run token by token (``gpu``-marked tests).  The Triton interpreter does not run the GPU's
tree for ``tl.sum`` over 128 columns (numpy sums them), so on the CPU the tests swap the
interpreter's ``tl.sum`` for the GPU's row-sum order (``tests/kernels/conftest.py``) and check
the fold against SGLang's kernel bit for bit.  ``K <= 128`` (one 4-column chunk per lane of
SGLang's layout).  The bits do not depend on the tile (``BV``, ``RL``) where every lane holds whole
4-column chunks (K = 128, the real shapes); at small K (24) Triton spreads a chunk's columns over
lanes, LLVM fuses a lane's own product into the first cross-lane add, the lanes' sums differ in
the last bit, and the tile decides which one a row uses (``test_gdn_verify.py::K_TILE``).  At
K = V = 32 on an H100 (thirty-second session) the L = 1 step matched SGLang bit for bit and the
fold of ring records at L = 16 did not (22 checkpoint elements of one slot, last bit).

Split precision (``HAS_READ``): the fold reads and writes the checkpoint only, then refreshes the
read copy from the checkpoint as stored (``read_copy.quantize_rows``'s bits: fp8 with one
power-of-two scale per value row); non-flush rows read ``S0`` from the copy instead of the
checkpoint.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm_kernels.mamba2_decode.read_copy import fp8_row_scale
from replayssm_kernels.stochastic_round import sr_key, sr_round_fp16


@triton.jit
def _first(a, b):
    return a


@triton.jit
def pin(x):
    """``x`` unchanged (no arithmetic): a size-2 reduction that keeps its first operand.

    A value's producer can be recomputed in a consumer's layout by Triton's layout optimiser; for
    the normalised k that means the division in the tile's layout, where every lane holds 64 of
    the 128 values (16x the work).  A reduction is not recomputed, so the division stays in the
    1-D layout and the value is moved to the tile's layout as a copy."""
    return tl.reduce(tl.join(x, x), 1, _first)


@triton.jit
def _cols(x, BK: tl.constexpr):
    """``[BK]`` vector (column ``4c + j``) -> ``[1, b0, b1, 1, b2, b3, b4, 4]`` (size-1 bits above
    ``BK / 4`` chunks)."""
    S0: tl.constexpr = 2 if BK >= 8 else 1
    S1: tl.constexpr = 2 if BK >= 16 else 1
    S2: tl.constexpr = 2 if BK >= 32 else 1
    S3: tl.constexpr = 2 if BK >= 64 else 1
    S4: tl.constexpr = 2 if BK >= 128 else 1
    x = tl.reshape(pin(x), (S4, S3, S2, S1, S0, 4))
    x = tl.permute(x, (4, 3, 2, 1, 0, 5))
    return x[None, :, :, None, :, :, :, :]


@triton.jit
def _rows(x):
    """``[RL, b0, b1, RH, b2, b3, b4, 4]`` products -> ``[RL, RH]`` row sums in SGLang's order."""
    x = tl.sum(x, 7)  # the lane's 4 columns, in order
    x = tl.sum(x, 6)  # xor 16
    x = tl.sum(x, 5)  # xor 8
    x = tl.sum(x, 4)  # xor 4
    x = tl.sum(x, 2)  # xor 2
    return tl.sum(x, 1)  # xor 1


@triton.jit
def _r8(x):
    """``[RL, RH]`` per-row values -> broadcastable against the tile."""
    return x[:, None, None, :, None, None, None, None]


@triton.jit
def _norm(x, USE_QK_L2NORM: tl.constexpr):
    # SGLang's expression and layout (1-D, [4] x [32] for K = 128).
    if USE_QK_L2NORM:
        x = x / tl.sqrt(tl.sum(x * x) + 1e-6)
    return x


@triton.jit
def _col8(BK: tl.constexpr):
    """Column ``4c + j`` of every position of the ``[1, b0, b1, 1, b2, b3, b4, 4]`` view."""
    S0: tl.constexpr = 2 if BK >= 8 else 1
    S1: tl.constexpr = 2 if BK >= 16 else 1
    S2: tl.constexpr = 2 if BK >= 32 else 1
    S3: tl.constexpr = 2 if BK >= 64 else 1
    S4: tl.constexpr = 2 if BK >= 128 else 1
    c0 = tl.arange(0, S0)[None, :, None, None, None, None, None, None]
    c1 = tl.arange(0, S1)[None, None, :, None, None, None, None, None]
    c2 = tl.arange(0, S2)[None, None, None, None, :, None, None, None]
    c3 = tl.arange(0, S3)[None, None, None, None, None, :, None, None]
    c4 = tl.arange(0, S4)[None, None, None, None, None, None, :, None]
    j = tl.arange(0, 4)[None, None, None, None, None, None, None, :]
    return 4 * (c0 + 2 * c1 + 4 * c2 + 8 * c3 + 16 * c4) + j


@triton.jit
def _row_max(x):
    """``[RL, b0, b1, RH, b2, b3, b4, 4]`` -> ``[RL, RH]`` maxima over the columns (exact in any
    order)."""
    return tl.max(tl.max(tl.max(tl.max(tl.max(tl.max(x, 7), 6), 5), 4), 2), 1)


@triton.jit
def flush_tree(
    state,
    p_s_head,
    p_rk,
    p_rv,
    p_rg,
    p_rb,
    p_q,
    p_k,
    p_v,
    p_o_head,
    p_rd_head,
    p_rs_head,
    sr_seed,
    sr_layer,
    i_s,
    i_hv,
    i_v,
    r_start,
    r_len,
    R,
    g_val,
    beta_val,
    scale,
    stride_s_v,
    stride_s_k,
    stride_rk_r,
    stride_rk_k,
    stride_rv_r,
    stride_rv_v,
    stride_g_r,
    stride_beta_r,
    stride_q_k,
    stride_k_k,
    stride_v_v,
    stride_o_v,
    stride_rd_v,
    stride_rd_k,
    stride_rs_v,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    RL: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    HAS_READ: tl.constexpr,
    READ_FP8: tl.constexpr,
    SR: tl.constexpr,
    o_dtype: tl.constexpr,
    WITH_TOKEN: tl.constexpr = True,
):
    """Flush rows: fold records ``[0, r_len)`` and the current token into the checkpoint tile of
    rows ``i_v·BV ..`` (``RL`` rows on lanes), write the output rows and store the tile once;
    with a read copy (``HAS_READ``), refresh it from the tile as stored.  ``p_s_head`` /
    ``p_o_head`` / ``p_rd_head`` / ``p_rs_head``: the row's state / output / copy / fp8 scales at
    this value head.  ``WITH_TOKEN=False`` (the verify's fold launch): the records only, no
    current token and no output (``p_q``, ``p_k``, ``p_v``, ``p_o_head``, ``g_val``, ``beta_val``
    and ``scale`` unused)."""
    RH: tl.constexpr = BV // RL
    rl = tl.arange(0, RL)
    rh = tl.arange(0, RH)
    row2 = i_v * BV + rh[None, :] * RL + rl[:, None]  # [RL, RH]
    mask_v2 = row2 < V
    col8 = _col8(BK)
    row8 = _r8(row2)
    mask_h = (row8 < V) & (col8 < K)
    p_s = p_s_head + row8 * stride_s_v + col8 * stride_s_k
    o_k = tl.arange(0, BK)
    mask_k = o_k < K

    # Always the checkpoint (never the read copy): the fold must start from the stored bits.
    b_h = tl.load(p_s, mask=mask_h, other=0).to(tl.float32)

    # ---- Records [0, r_len): raw rows prefetched two ahead; the next record's k is normalised
    # (and pinned) one iteration early, off the state's critical path.
    row = r_start % R
    pf = r_len > 0
    n0_k = tl.load(p_rk + row * stride_rk_r + o_k * stride_rk_k, mask=mask_k & pf, other=0)
    n0_v = tl.load(p_rv + row * stride_rv_r + row2 * stride_rv_v, mask=mask_v2 & pf, other=0)
    n0_g = tl.load(p_rg + row * stride_g_r, mask=pf, other=0.0)
    n0_b = tl.load(p_rb + row * stride_beta_r, mask=pf, other=0.0)
    row = (r_start + 1) % R
    pf = r_len > 1
    n1_k = tl.load(p_rk + row * stride_rk_r + o_k * stride_rk_k, mask=mask_k & pf, other=0)
    n1_v = tl.load(p_rv + row * stride_rv_r + row2 * stride_rv_v, mask=mask_v2 & pf, other=0)
    n1_g = tl.load(p_rg + row * stride_g_r, mask=pf, other=0.0)
    n1_b = tl.load(p_rb + row * stride_beta_r, mask=pf, other=0.0)
    n0_kn = pin(_norm(n0_k.to(tl.float32), USE_QK_L2NORM))
    for i_r in range(0, r_len):
        b_k = _cols(n0_kn, BK)
        b_v = n0_v.to(tl.float32)
        b_g = n0_g
        b_beta = n0_b
        n0_v, n0_g, n0_b = n1_v, n1_g, n1_b
        n0_kn = pin(_norm(n1_k.to(tl.float32), USE_QK_L2NORM))
        row = (r_start + i_r + 2) % R
        pf = i_r + 2 < r_len
        n1_k = tl.load(p_rk + row * stride_rk_r + o_k * stride_rk_k, mask=mask_k & pf, other=0)
        n1_v = tl.load(p_rv + row * stride_rv_r + row2 * stride_rv_v, mask=mask_v2 & pf, other=0)
        n1_g = tl.load(p_rg + row * stride_g_r, mask=pf, other=0.0)
        n1_b = tl.load(p_rb + row * stride_beta_r, mask=pf, other=0.0)
        b_h *= tl.exp(b_g)
        b_v -= _rows(b_h * b_k)
        b_v *= b_beta
        b_h += _r8(b_v) * b_k

    # ---- The current token, then the output from the folded state (SGLang's step).
    if WITH_TOKEN:
        b_q = tl.load(p_q + o_k * stride_q_k, mask=mask_k, other=0).to(tl.float32)
        b_k = tl.load(p_k + o_k * stride_k_k, mask=mask_k, other=0).to(tl.float32)
        b_v = tl.load(p_v + row2 * stride_v_v, mask=mask_v2, other=0).to(tl.float32)
        b_q = _norm(b_q, USE_QK_L2NORM)
        b_k = _cols(_norm(b_k, USE_QK_L2NORM), BK)
        b_q = _cols(b_q * scale, BK)
        b_h *= tl.exp(g_val)
        b_v -= _rows(b_h * b_k)
        b_v *= beta_val
        b_h += _r8(b_v) * b_k
        b_o = _rows(b_h * b_q)
        tl.store(p_o_head + row2 * stride_o_v, b_o.to(o_dtype), mask=mask_v2)
    if SR:
        b_st = sr_round_fp16(b_h, sr_key(sr_seed, sr_layer, i_s), (i_hv * V + row8) * K + col8)
    else:
        b_st = b_h.to(state.dtype.element_ty)
    tl.store(p_s, b_st, mask=mask_h)
    if HAS_READ:
        # The copy from the checkpoint as stored (``quantize_rows``): masked entries are zeros,
        # so they do not enter an fp8 row's max.
        b_c = b_st.to(tl.float32)
        if READ_FP8:
            rscale, inv = fp8_row_scale(_row_max(tl.abs(b_c)))
            tl.store(p_rs_head + row2 * stride_rs_v, rscale, mask=mask_v2)
            b_c = b_c * _r8(inv)
        # Stored from a [BV, BK] view (rows, then columns in order), so the store takes a
        # layout of its own with whole 16-byte runs per lane (the tile's 4-column chunks are 8 /
        # 4 bytes of the copy, half / quarter sectors per lane).
        b_c2 = tl.reshape(tl.permute(b_c, (3, 0, 6, 5, 4, 2, 1, 7)), (BV, BK))
        o_v2 = i_v * BV + tl.arange(0, BV)
        p_rd = p_rd_head + o_v2[:, None] * stride_rd_v + o_k[None, :] * stride_rd_k
        tl.store(p_rd, b_c2.to(p_rd.dtype.element_ty),
                 mask=(o_v2[:, None] < V) & mask_k[None, :])


@triton.jit
def _ring_row(x, R):
    # (start + j) % R for a live record (start < R, j < len <= R, so x < 2R): one compare
    # instead of an integer division; rows of masked records (never loaded) may be anything.
    return tl.where(x >= R, x - R, x)


@triton.jit
def _chunk_key_loads(
    base, p_rg, p_rk, r_start, r_len, R, o_r, rec2, col8, mask_c8, stride_g_r, stride_rk_r,
    stride_rk_k,
):  # fmt: skip
    """Records ``base .. base + BR − 1`` of a non-flush row (masked past ``r_len``): gates
    ``[BR]`` and raw keys in the dots layout ``[PL, QL]`` × the state tile's K chunks (stored
    dtypes; one per key head, whatever the value tile)."""
    o_rc = base + o_r
    c_g = tl.load(p_rg + _ring_row(r_start + o_rc, R) * stride_g_r, mask=o_rc < r_len, other=0.0)
    r8 = _r8(base + rec2)
    c_k = tl.load(p_rk + _ring_row(r_start + r8, R) * stride_rk_r + col8 * stride_rk_k,
                  mask=(r8 < r_len) & mask_c8, other=0)
    return c_g, c_k


@triton.jit
def _chunk_u_loads(base, p_ru, r_start, r_len, R, rec_u, row2, mask_v2, stride_u_r, stride_u_v):
    """The same records' ``u`` for the value rows ``row2``, in the sum layout
    ``[RL, UL, RH, UH]`` (stored dtype)."""
    rr = base + rec_u
    return tl.load(
        p_ru + _ring_row(r_start + rr, R) * stride_u_r + row2[:, None, :, None] * stride_u_v,
        mask=(rr < r_len) & mask_v2[:, None, :, None], other=0,
    )


@triton.jit
def _chunk_coefs(
    c_g, c_k, base, r_len, o_r, k8, q8, b_gsum, BR: tl.constexpr, QL: tl.constexpr,
    PL: tl.constexpr, UL: tl.constexpr, UH: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
):  # fmt: skip
    """One chunk's record coefficients ``ω_j (k̂_j·k̂_c)`` and ``ω_j (k̂_j·q̃_c)`` in the ``u``
    sum layout ``[1, UL, 1, UH]``, and its gates added to the suffix sum (chunks newest first).
    Per key head: the same for every value tile of a program."""
    # 1-D: the gates and their suffix sums
    mask_r = base + o_r < r_len
    b_w = tl.where(mask_r, tl.exp(tl.cumsum(c_g, 0, reverse=True) - c_g + b_gsum), 0.0)
    b_gsum += tl.sum(c_g, 0)
    # dots: records on lanes, K chunks as the state tile's
    c_k = c_k.to(tl.float32)
    b_kk = _rows(c_k * k8)
    b_kq = _rows(c_k * q8)
    if USE_QK_L2NORM:
        b_rn = 1.0 / tl.sqrt(_rows(c_k * c_k) + 1e-6)
        b_kk = b_kk * b_rn
        b_kq = b_kq * b_rn
    # the weights, per record of the dots layout -> 1-D chunk order -> the u layout
    w2 = tl.reshape(tl.permute(tl.reshape(b_w, (QL, PL)), (1, 0)), (PL, QL))
    ck = tl.reshape(tl.permute(w2 * b_kk, (1, 0)), (BR,))
    cq = tl.reshape(tl.permute(w2 * b_kq, (1, 0)), (BR,))
    ck = tl.permute(tl.reshape(ck, (UH, UL)), (1, 0))[None, :, None, :]
    cq = tl.permute(tl.reshape(cq, (UH, UL)), (1, 0))[None, :, None, :]
    return ck, cq, b_gsum


@triton.jit
def _chunk_acc(c_u, ck, cq, b_acc_k, b_acc_q):
    """``Σ_j c_j u_j`` of one chunk added to the accumulators: value rows on lanes (a lane's
    ``RH`` rows contiguous), records in registers."""
    c_u = c_u.to(tl.float32)
    b_acc_k += tl.sum(tl.sum(c_u * ck, 3), 1)
    b_acc_q += tl.sum(tl.sum(c_u * cq, 3), 1)
    return b_acc_k, b_acc_q


@triton.jit
def _tile_loads(
    p_s_head, p_rd_head, p_rs_head, p_v, row2, mask_v2, col8, mask_c8, stride_s_v, stride_s_k,
    stride_rd_v, stride_rd_k, stride_rs_v, stride_v_v, V: tl.constexpr, HAS_READ: tl.constexpr,
    READ_FP8: tl.constexpr,
):  # fmt: skip
    """One value tile's ``S0`` (fp32 ``[RL, b0, b1, RH, b2, b3, b4, 4]``; with ``HAS_READ`` the
    read copy, with fp8 also its row scales ``[RL, RH]``, else a placeholder) and raw ``v``."""
    row8 = _r8(row2)
    if HAS_READ:
        b_h0 = tl.load(p_rd_head + row8 * stride_rd_v + col8 * stride_rd_k,
                       mask=(row8 < V) & mask_c8, other=0.0).to(tl.float32)
    else:
        b_h0 = tl.load(p_s_head + row8 * stride_s_v + col8 * stride_s_k,
                       mask=(row8 < V) & mask_c8, other=0).to(tl.float32)
    if READ_FP8:
        b_rs = tl.load(p_rs_head + row2 * stride_rs_v, mask=mask_v2, other=0.0)
    else:
        b_rs = tl.zeros(row2.shape, dtype=tl.float32)
    b_v_raw = tl.load(p_v + row2 * stride_v_v, mask=mask_v2, other=0)
    return b_h0, b_rs, b_v_raw


@triton.jit
def nonflush_rows(
    p_s_head,
    p_ru,
    p_rk,
    p_rv,
    p_rg,
    p_rb,
    p_q,
    p_k,
    p_v,
    p_o_head,
    p_rd_head,
    p_rs_head,
    i_hv,
    i_g,
    r_start,
    r_len,
    R,
    g_val,
    beta_val,
    scale,
    stride_s_v,
    stride_s_k,
    stride_u_r,
    stride_u_v,
    stride_rk_r,
    stride_rk_k,
    stride_rv_r,
    stride_rv_v,
    stride_g_r,
    stride_beta_r,
    stride_q_k,
    stride_k_k,
    stride_v_v,
    stride_o_v,
    stride_rd_v,
    stride_rd_k,
    stride_rs_v,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BR: tl.constexpr,
    RL: tl.constexpr,
    TILES: tl.constexpr,
    ONE_CHUNK: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    HAS_READ: tl.constexpr,
    READ_FP8: tl.constexpr,
    o_dtype: tl.constexpr,
    u_dtype: tl.constexpr,
    k_dtype: tl.constexpr,
    v_dtype: tl.constexpr,
):
    """Non-flush rows: the inner-product output (math.md §4) with every reduction laid out
    rows-on-lanes, as ``flush_tree`` does for the fold.  ``S_w`` is never built: one pass over the
    checkpoint tile (with ``HAS_READ``: the read copy, fp8 times its row scales; the checkpoint is
    not read) gives ``S0·k̂_c`` and ``S0·q̃_c``; the records add ``Σ_j ω_j (k̂_j·k̂_c) u_j`` and
    ``Σ_j ω_j (k̂_j·q̃_c) u_j`` with ``ω_j = exp(Σ_{i>j} g_i)``, then ``u_c = β(v − α·hk)``,
    ``y = α·hq + (k̂_c·q̃_c)·u_c``.  Outputs only (never a checkpoint), so the sums may run in any
    order: the state's two mat-vecs, the records' three dots (``k_j·k̂``, ``k_j·q̃``, ``|k_j|²``,
    records on lanes) and the records' ``Σ_j c_j u_j`` (value rows on lanes, records in registers)
    each need 2 or fewer shuffle levels.

    The program owns ``TILES`` value tiles ``i_g·TILES + t`` of one head, one after another; a
    tile's rows are ``(i_g·TILES + t)·BV + rl·RH + rh`` (``rl`` on lanes, ``RH = BV / RL`` rows in
    registers, so a lane's rows of ``u`` are contiguous).  The per-key-head work (q / k norms and,
    with ``ONE_CHUNK``, the records' gates, dots and coefficients) is done once per program; the
    next tile's loads are issued before the current tile's record sums and stores.  Records come
    in chunks of ``BR`` (``BR // 8`` per lane), newest chunk first; ``ONE_CHUNK`` (``R <= BR``,
    every decode-only ring): the one chunk's loads are issued with the first tile's, so both
    arrive in one memory round trip; otherwise every tile loops over the chunks (coefficients per
    tile).  The record ``(u_c, raw k_c, raw v_c, g_c, β_c)`` is appended at logical row ``len``
    (k by one program per key head, g and β by the first tile group)."""
    RH: tl.constexpr = BV // RL
    # records of a chunk: dots on [8 lanes, BR // 8 regs]; the u sum on [4 lanes, BR // 4 regs]
    QL: tl.constexpr = BR // 8 if BR >= 8 else 1
    PL: tl.constexpr = BR // QL
    UL: tl.constexpr = 4 if BR >= 4 else BR
    UH: tl.constexpr = BR // UL
    rows = tl.arange(0, RL)[:, None] * RH + tl.arange(0, RH)[None, :]  # [RL, RH]
    col8 = _col8(BK)
    mask_c8 = col8 < K
    ql = tl.arange(0, PL)
    qh = tl.arange(0, QL)
    rec2 = qh[None, :] * PL + ql[:, None]  # [PL, QL]: record of a chunk, dots layout
    ul = tl.arange(0, UL)
    uh = tl.arange(0, UH)
    rec_u = (uh[None, None, None, :] * UL + ul[None, :, None, None])  # [1, UL, 1, UH]
    o_r = tl.arange(0, BR)
    w_row = (r_start + r_len) % R

    row2 = i_g * TILES * BV + rows
    mask_v2 = row2 < V
    if ONE_CHUNK:
        c_g0, c_k0 = _chunk_key_loads(
            0, p_rg, p_rk, r_start, r_len, R, o_r, rec2, col8, mask_c8, stride_g_r, stride_rk_r,
            stride_rk_k,
        )  # fmt: skip
        c_u0 = _chunk_u_loads(0, p_ru, r_start, r_len, R, rec_u, row2, mask_v2, stride_u_r,
                              stride_u_v)
    b_h0, b_rs, b_v_raw = _tile_loads(
        p_s_head, p_rd_head, p_rs_head, p_v, row2, mask_v2, col8, mask_c8, stride_s_v,
        stride_s_k, stride_rd_v, stride_rd_k, stride_rs_v, stride_v_v, V, HAS_READ, READ_FP8,
    )  # fmt: skip

    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    b_q_raw = tl.load(p_q + o_k * stride_q_k, mask=mask_k, other=0)
    b_k_raw = tl.load(p_k + o_k * stride_k_k, mask=mask_k, other=0)
    b_q = _norm(b_q_raw.to(tl.float32), USE_QK_L2NORM) * scale
    b_k = _norm(b_k_raw.to(tl.float32), USE_QK_L2NORM)
    b_kq_c = tl.sum(b_k * b_q)
    k8 = _cols(b_k, BK)
    q8 = _cols(b_q, BK)
    b_alpha = tl.exp(g_val)

    for t in tl.static_range(TILES):
        b_hk = _rows(b_h0 * k8)
        b_hq = _rows(b_h0 * q8)
        if READ_FP8:
            b_hk = b_hk * b_rs
            b_hq = b_hq * b_rs
        b_v = b_v_raw.to(tl.float32)
        if ONE_CHUNK and t == 0:  # the records' coefficients, once per program
            ck0, cq0, b_gsum = _chunk_coefs(
                c_g0, c_k0, 0, r_len, o_r, k8, q8, tl.sum(tl.zeros([BR], dtype=tl.float32), 0),
                BR, QL, PL, UL, UH, USE_QK_L2NORM,
            )  # fmt: skip
            b_decay = tl.exp(b_gsum)
        if t + 1 < TILES:  # the next tile's loads, before this tile's record sums and stores
            n_row2 = row2 + BV
            n_mask_v2 = n_row2 < V
            n_h0, n_rs, n_v_raw = _tile_loads(
                p_s_head, p_rd_head, p_rs_head, p_v, n_row2, n_mask_v2, col8, mask_c8,
                stride_s_v, stride_s_k, stride_rd_v, stride_rd_k, stride_rs_v, stride_v_v, V,
                HAS_READ, READ_FP8,
            )  # fmt: skip
            if ONE_CHUNK:
                n_u0 = _chunk_u_loads(0, p_ru, r_start, r_len, R, rec_u, n_row2, n_mask_v2,
                                      stride_u_r, stride_u_v)

        # Records, newest chunk first (ω_j = exp(Σ_{i>j} g_i) as a suffix sum).
        b_acc_k = tl.zeros([RL, RH], dtype=tl.float32)
        b_acc_q = tl.zeros([RL, RH], dtype=tl.float32)
        if ONE_CHUNK:
            b_acc_k, b_acc_q = _chunk_acc(c_u0, ck0, cq0, b_acc_k, b_acc_q)
        else:
            b_gsum = tl.sum(tl.zeros([BR], dtype=tl.float32), 0)
            n_chunks = tl.cdiv(r_len, BR)
            for i_c in range(0, n_chunks):
                base = (n_chunks - 1 - i_c) * BR
                c_g, c_k = _chunk_key_loads(
                    base, p_rg, p_rk, r_start, r_len, R, o_r, rec2, col8, mask_c8, stride_g_r,
                    stride_rk_r, stride_rk_k,
                )  # fmt: skip
                c_u = _chunk_u_loads(base, p_ru, r_start, r_len, R, rec_u, row2, mask_v2,
                                     stride_u_r, stride_u_v)
                ck, cq, b_gsum = _chunk_coefs(
                    c_g, c_k, base, r_len, o_r, k8, q8, b_gsum, BR, QL, PL, UL, UH,
                    USE_QK_L2NORM,
                )  # fmt: skip
                b_acc_k, b_acc_q = _chunk_acc(c_u, ck, cq, b_acc_k, b_acc_q)
            b_decay = tl.exp(b_gsum)

        b_hk = b_decay * b_hk + b_acc_k
        b_hq = b_decay * b_hq + b_acc_q
        b_u_c = beta_val * (b_v - b_alpha * b_hk)
        b_o = b_alpha * b_hq + b_kq_c * b_u_c
        tl.store(p_o_head + row2 * stride_o_v, b_o.to(o_dtype), mask=mask_v2)
        # Append the current record's value rows at logical row len.
        tl.store(p_ru + w_row * stride_u_r + row2 * stride_u_v, b_u_c.to(u_dtype), mask=mask_v2)
        tl.store(p_rv + w_row * stride_rv_r + row2 * stride_rv_v, b_v_raw.to(v_dtype),
                 mask=mask_v2)
        if t + 1 < TILES:
            row2, mask_v2, b_h0, b_rs, b_v_raw = n_row2, n_mask_v2, n_h0, n_rs, n_v_raw
            if ONE_CHUNK:
                c_u0 = n_u0

    if i_g == 0:
        tl.store(p_rg + w_row * stride_g_r, g_val)
        tl.store(p_rb + w_row * stride_beta_r, beta_val)
        if i_hv % (HV // H) == 0:
            tl.store(p_rk + w_row * stride_rk_r + o_k * stride_rk_k, b_k_raw.to(k_dtype),
                     mask=mask_k)
