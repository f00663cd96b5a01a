"""Gated DeltaNet verify, launch 2: the window outputs and records of every row, by matrix products.

``gdn_verify_window_kernel`` runs after the fold launch (``fold.py``), so a flush row's checkpoint
is already folded and stored and its history is empty here; a non-flush row's history is its
committed records ``[0, len)``.  No state is formed: one program owns ``BV`` value rows of one value
head of one row and streams that slab of ``S0`` (the checkpoint, or with a read copy the copy:
a flush row's as the fold launch refreshed it) once, in ``BKC``-column chunks, as ``S0·X`` where
the ``NX`` columns of ``X`` are the window's raw keys ``k_0 .. k_{T-1}`` then raw queries
``q_0 .. q_{T-1}`` (zero padding up to ``NX``).  In the same pass it forms the history's
``K_h·X`` and the window Gram matrix ``XᵀX`` and the squared norms of both, so normalisation is
applied to the products afterwards (``k̂ = k / sqrt(|k|² + 1e-6)``,
``q̃ = scale·q / sqrt(|q|² + 1e-6)``).

With ``ω_j = exp(Σ_{i>j} g_i)`` and ``Γ = exp(Σ_j g_j)`` over the history, the state before the
window applied to any column is ``S_h x = Γ S0 x + Σ_j ω_j (k̂_j·x) u_j`` (the stored corrected
updates ``u_j``: ``U_h (ω ⊙ K̂_h X)``).  With ``D_s = exp(Σ_{i<=s} g_i)`` over the window, the
delta rule's corrected updates solve a unit triangular system shared by every value row,
``u_s + Σ_{i<s} β_s (D_s/D_i)(k̂_i·k̂_s) u_i = β_s (v_s − D_s S_h k̂_s)`` (row vector ``u = r (I + C)⁻¹``,
``C`` strictly upper triangular and nilpotent, so ``(I + C)⁻¹ = Π_p (I + (−C)^{2^p})`` over
``ceil(log2 T)`` factors), and the outputs are
``y_s = D_s S_h q̃_s + Σ_{i<=s} (D_s/D_i)(k̂_i·q̃_s) u_i``.  Both are one product
``[U | Y] = Z · M`` with ``Z = [r | D ⊙ S_h Q̃]`` and ``M = (I + C)⁻¹ (I + E)`` (``E`` holds the
``(D_s/D_i)(k̂_i·q̃_s)`` block), all ``NX × NX``.

Precision (``PRECISION``): ``"split"`` (16-bit q / k, whose values tf32 holds exactly): the fp32
``S0`` chunk is split into a tf32 head (low 13 mantissa bits cleared) and the fp32 remainder, two
tf32 tensor-core products; the history and Gram products are single tf32 products (exact
products of 16-bit values, fp32 sums); a read copy's values (bf16, fp16, e4m3; the fp8 row
scales applied to the product) are exact in tf32: one product.  ``"ieee"``: fp32 FMA products
everywhere (fp32 q / k).  The ``NX × NX`` products are always ``"ieee"``; the two ``[BV, NX]``
products of fp32 operands (the history update, the outputs) are tf32x3 under ``"split"``.
Outputs and ``u`` never feed a checkpoint (the fold replays raw inputs), so their summation order
is free; the records' ``g`` and ``β`` are the decode kernel's expressions, element for element,
because a later fold replays those bits.

Records ``(u_s, raw k_s, raw v_s, g_s, β_s)`` of all ``T`` tokens go to logical rows
``len .. len + T − 1`` (physical ``(start + len + s) % R``), accepted or not, as the recurrent
form wrote them; k by the first value block of the first value head of each key head, g and β by
the first value block.  Padding rows (slot ``-1``) return at once.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tf32_head(x):
    """``x`` with its low 13 mantissa bits cleared: exact in tf32, and ``x − head`` is exact."""
    return (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def gdn_verify_window_kernel(
    # Pointers
    state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, o,
    slot_idx, ring_start, ring_len, flush, scale, read_ptr, read_scale_ptr,
    # Matrix dimensions
    R,
    # Strides
    stride_s_n, stride_s_h, stride_s_v, stride_s_k,
    stride_u_n, stride_u_h, stride_u_r, stride_u_v,
    stride_rk_n, stride_rk_h, stride_rk_r, stride_rk_k,
    stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
    stride_g_n, stride_g_h, stride_g_r,
    stride_beta_n, stride_beta_h, stride_beta_r,
    stride_q_b, stride_q_t, stride_q_h, stride_q_k,
    stride_k_b, stride_k_t, stride_k_h, stride_k_k,
    stride_v_b, stride_v_t, stride_v_h, stride_v_v,
    stride_a_b, stride_a_t, stride_a_h,
    stride_b_b, stride_b_t, stride_b_h,
    stride_o_b, stride_o_t, stride_o_h, stride_o_v,
    stride_rd_n, stride_rd_h, stride_rd_v, stride_rd_k,
    stride_rs_n, stride_rs_h, stride_rs_v,
    # Meta-parameters
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
    BK: tl.constexpr, BKC: tl.constexpr, BV: tl.constexpr, NX: tl.constexpr, NH: tl.constexpr,
    LOG2T: tl.constexpr, SOFTPLUS_THRESHOLD: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
    HAS_READ: tl.constexpr, READ_FP8: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One program: value rows ``i_v·BV ..`` of value head ``i_hv`` of batch row ``i_n``."""
    i_v, i_hv, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    i_s = tl.load(slot_idx + i_n).to(tl.int64)
    if i_s < 0:
        return
    r_start = tl.load(ring_start + i_n).to(tl.int32)
    r_len = tl.load(ring_len + i_n).to(tl.int32)
    is_flush = tl.load(flush + i_n).to(tl.int32) != 0
    n_h = tl.where(is_flush, 0, r_len)
    SMALL: tl.constexpr = "tf32" if PRECISION == "split" else PRECISION
    # The [BV, NX] products of fp32 operands (history update, outputs): three tf32 products.
    WIDE: tl.constexpr = "tf32x3" if PRECISION == "split" else PRECISION

    o_v = i_v * BV + tl.arange(0, BV)
    mask_v = o_v < V
    cx = tl.arange(0, NX)
    is_k = cx < T
    is_q = (cx >= T) & (cx < 2 * T)
    tok = tl.where(is_k, cx, tl.where(is_q, cx - T, 0))
    w_row = (r_start + r_len + tok) % R
    jh = tl.arange(0, NH)
    mask_hr = jh < n_h
    h_row = (r_start + jh) % R

    p_s = state + i_s * stride_s_n + i_hv * stride_s_h + o_v[:, None] * stride_s_v
    p_xk = k + i_n * stride_k_b + i_h * stride_k_h + tok[None, :] * stride_k_t
    p_xq = q + i_n * stride_q_b + i_h * stride_q_h + tok[None, :] * stride_q_t
    p_kh = ring_k + i_s * stride_rk_n + i_h * stride_rk_h + h_row[:, None] * stride_rk_r
    p_kw = ring_k + i_s * stride_rk_n + i_h * stride_rk_h + w_row[None, :] * stride_rk_r
    write_k = (i_v == 0) & (i_hv % (HV // H) == 0)

    acc_s = tl.zeros([BV, NX], dtype=tl.float32)
    acc_a = tl.zeros([NH, NX], dtype=tl.float32)
    acc_g = tl.zeros([NX, NX], dtype=tl.float32)
    ss_x = tl.zeros([NX], dtype=tl.float32)
    ss_h = tl.zeros([NH], dtype=tl.float32)
    for kc in range(0, BK, BKC):
        o_k = kc + tl.arange(0, BKC)
        mask_k = o_k < K
        m_kx = mask_k[:, None] & is_k[None, :]
        x_k = tl.load(p_xk + o_k[:, None] * stride_k_k, mask=m_kx, other=0)
        x_q = tl.load(p_xq + o_k[:, None] * stride_q_k, mask=mask_k[:, None] & is_q[None, :],
                      other=0)
        b_x = x_k.to(tl.float32) + x_q.to(tl.float32)  # [BKC, NX]
        if write_k:
            tl.store(p_kw + o_k[:, None] * stride_rk_k, x_k.to(ring_k.dtype.element_ty), mask=m_kx)
        m_s = mask_v[:, None] & mask_k[None, :]
        # Split precision: every row reads S0 from the copy (flush rows: refreshed by the fold
        # launch); its values are exact in tf32, so one tf32 product.
        if HAS_READ:
            b_s = tl.load(read_ptr + i_s * stride_rd_n + i_hv * stride_rd_h
                          + o_v[:, None] * stride_rd_v + o_k[None, :] * stride_rd_k,
                          mask=m_s, other=0.0).to(tl.float32)
        else:
            b_s = tl.load(p_s + o_k[None, :] * stride_s_k, mask=m_s, other=0).to(tl.float32)
        b_kh = tl.load(p_kh + o_k[None, :] * stride_rk_k, mask=mask_hr[:, None] & mask_k[None, :],
                       other=0).to(tl.float32)  # [NH, BKC]
        if HAS_READ:
            acc_s = tl.dot(b_s, b_x, acc_s, input_precision=SMALL)
        elif PRECISION == "split":
            s_hi = _tf32_head(b_s)
            acc_s = tl.dot(s_hi, b_x, acc_s, input_precision="tf32")
            acc_s = tl.dot(b_s - s_hi, b_x, acc_s, input_precision="tf32")
        else:
            acc_s = tl.dot(b_s, b_x, acc_s, input_precision=PRECISION)
        acc_a = tl.dot(b_kh, b_x, acc_a, input_precision=SMALL)
        acc_g = tl.dot(tl.trans(b_x), b_x, acc_g, input_precision=SMALL)
        ss_x += tl.sum(b_x * b_x, 0)
        ss_h += tl.sum(b_kh * b_kh, 1)

    # Normalisation of the products' columns (k̂, q̃) and of the history keys' rows.
    if USE_QK_L2NORM:
        n_x = 1.0 / tl.sqrt(ss_x + 1e-6)
        n_h_row = 1.0 / tl.sqrt(ss_h + 1e-6)
    else:
        n_x = tl.full([NX], 1.0, tl.float32)
        n_h_row = tl.full([NH], 1.0, tl.float32)
    n_x = tl.where(is_q, n_x * scale, n_x)
    b_sx = acc_s * n_x[None, :]
    if READ_FP8:
        b_rs = tl.load(read_scale_ptr + i_s * stride_rs_n + i_hv * stride_rs_h
                       + o_v * stride_rs_v, mask=mask_v, other=0.0)
        b_sx = b_sx * b_rs[:, None]
    b_a = acc_a * n_h_row[:, None] * n_x[None, :]
    b_gram = acc_g * n_x[:, None] * n_x[None, :]

    # History: S_h x = Γ S0 x + U_h (ω ⊙ K̂_h X).
    b_gh = tl.load(ring_g + i_s * stride_g_n + i_hv * stride_g_h + h_row * stride_g_r,
                   mask=mask_hr, other=0.0)
    g_tot = tl.sum(b_gh, 0)
    b_w = tl.exp(g_tot - tl.cumsum(b_gh, 0))
    b_uh = tl.load(ring_u + i_s * stride_u_n + i_hv * stride_u_h + h_row[None, :] * stride_u_r
                   + o_v[:, None] * stride_u_v, mask=mask_v[:, None] & mask_hr[None, :],
                   other=0).to(tl.float32)  # [BV, NH]
    b_sx = tl.exp(g_tot) * b_sx + tl.dot(b_uh, b_w[:, None] * b_a, input_precision=WIDE)

    # Window gates: the decode kernel's expressions, element for element.
    valid = is_k | is_q
    x_g = tl.load(a + i_n * stride_a_b + tok * stride_a_t + i_hv * stride_a_h, mask=valid,
                  other=0).to(tl.float32) + tl.load(dt_bias + i_hv).to(tl.float32)
    softplus_x = tl.where(x_g <= SOFTPLUS_THRESHOLD, tl.log(1.0 + tl.exp(x_g)), x_g)
    g_val = -tl.exp(tl.load(A_log + i_hv).to(tl.float32)) * softplus_x
    b_in = tl.load(b + i_n * stride_b_b + tok * stride_b_t + i_hv * stride_b_h, mask=valid,
                   other=0)
    beta_val = tl.sigmoid(b_in.to(tl.float32)).to(b.dtype.element_ty).to(tl.float32)
    # Cumulative window log-decay of each column's token: Σ_{i<=s} g_i.
    c_r = cx[:, None]
    c_c = cx[None, :]
    g_cum = tl.sum(tl.where((c_c <= tok[:, None]) & is_k[None, :], g_val[None, :], 0.0), 1)
    d_win = tl.exp(g_cum)

    v_raw = tl.load(v + i_n * stride_v_b + i_hv * stride_v_h + tok[None, :] * stride_v_t
                    + o_v[:, None] * stride_v_v, mask=mask_v[:, None] & is_k[None, :], other=0)
    b_z = tl.where(is_k[None, :], beta_val[None, :] * (v_raw.to(tl.float32) - d_win[None, :] * b_sx),
                   tl.where(is_q[None, :], d_win[None, :] * b_sx, 0.0))
    ratio = tl.exp(g_cum[None, :] - g_cum[:, None])  # D_c / D_i
    eye = tl.where(c_r == c_c, 1.0, 0.0)
    b_c = tl.where((c_r < c_c) & is_k[None, :], beta_val[None, :] * ratio * b_gram, 0.0)
    b_e = tl.where(is_k[:, None] & is_q[None, :] & (c_r <= c_c - T), ratio * b_gram, 0.0)
    # (I + C)⁻¹ = (I − C)(I + C²)(I + C⁴)… (C nilpotent of order T).
    b_p = -b_c
    b_m = eye + b_p
    for _ in tl.static_range(1, LOG2T):
        b_p = tl.dot(b_p, b_p, input_precision="ieee")
        b_m = tl.dot(b_m, eye + b_p, input_precision="ieee")
    b_m = b_m + tl.dot(b_m, b_e, input_precision="ieee")
    b_out = tl.dot(b_z, b_m, input_precision=WIDE)  # [BV, NX]: u in k columns, y in q columns

    tl.store(o + i_n * stride_o_b + i_hv * stride_o_h + tok[None, :] * stride_o_t
             + o_v[:, None] * stride_o_v, b_out.to(o.dtype.element_ty),
             mask=mask_v[:, None] & is_q[None, :])
    m_rec = mask_v[:, None] & is_k[None, :]
    tl.store(ring_u + i_s * stride_u_n + i_hv * stride_u_h + w_row[None, :] * stride_u_r
             + o_v[:, None] * stride_u_v, b_out.to(ring_u.dtype.element_ty), mask=m_rec)
    tl.store(ring_v + i_s * stride_rv_n + i_hv * stride_rv_h + w_row[None, :] * stride_rv_r
             + o_v[:, None] * stride_rv_v, v_raw.to(ring_v.dtype.element_ty), mask=m_rec)
    if i_v == 0:
        tl.store(ring_g + i_s * stride_g_n + i_hv * stride_g_h + w_row * stride_g_r, g_val,
                 mask=is_k)
        tl.store(ring_beta + i_s * stride_beta_n + i_hv * stride_beta_h + w_row * stride_beta_r,
                 beta_val, mask=is_k)
