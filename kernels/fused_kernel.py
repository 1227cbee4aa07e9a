"""The fused BitDelta Triton kernel: y = x·(W + α⊙S)ᵀ (+b) for one or many deltas, one launch.

Layout ("swap AB"): a program owns BLOCK_N output features (rows of W) and BLOCK_M rows of x and
computes acc[BLOCK_N, BLOCK_M] = W_eff[BLOCK_N, K] · xᵀ[K, BLOCK_M]. W rows are the MMA's M side,
so a decode step (M ≤ 16 rows of x) still fills a 64-row wgmma tile instead of wasting 15/16 of a
16-row tile on padding (the published BitDelta kernel's decode layout).

Per K step the program streams a [BLOCK_N, BLOCK_K] bf16 tile of W and the matching
[BLOCK_N, BLOCK_K/8] bytes of signs, builds W_eff = W + where(bit, α, -α) in registers (in the
activation dtype: one HADD2 per two elements) and feeds one tensor-core dot. W + α⊙S is never
written to memory.

Three ways of walking rows (ROW_MODE):
  0  single delta: row tile t covers rows [t·BLOCK_M, (t+1)·BLOCK_M).
  1  grouped, tiles: rows are sorted by delta id (perm); segment s = delta s-1 (s = 0: base only).
     Row tile slots are assigned to segments in-kernel from the segment offsets (a cumsum over
     D+1 counts), so no host sync and a fixed grid: good for prefill.
  2  grouped, slots: all M ≤ BLOCK_M rows sit in one tile; NSLOT (delta, lo, hi) slots are
     unrolled inside the K loop so the W tile is loaded once and each delta's bits once: decode.

SPLIT_K > 1 (decode only, one row tile) splits K over programs; partial tiles meet in an fp32
workspace and the last program to arrive (atomic ticket) finishes the tile and re-zeroes the
workspace, so the op stays one launch and needs no memset.
"""

import triton
import triton.language as tl


@triton.jit
def _signed_alpha(p, alpha, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """p: uint8 [BLOCK_N, BLOCK_K/8], alpha: [BLOCK_N] -> where(bit, α, -α) as [BLOCK_N, BLOCK_K]."""
    offs_j = tl.arange(0, 8)
    bits = (p[:, :, None].to(tl.int32) >> offs_j[None, None, :]) & 1          # LSB first
    signed = tl.where(bits != 0, alpha[:, None, None], -alpha[:, None, None])
    return tl.reshape(signed, [BLOCK_N, BLOCK_K])


@triton.jit
def _segment_of_tile(seg_ptr, tile, NUM_SEG, BLOCK_M: tl.constexpr, SEG_P2: tl.constexpr):
    """ROW_MODE 1: which segment owns row-tile slot `tile`, and its row range [lo, hi)."""
    offs = tl.arange(0, SEG_P2)
    starts = tl.load(seg_ptr + offs, mask=offs < NUM_SEG, other=0)
    ends = tl.load(seg_ptr + offs + 1, mask=offs < NUM_SEG, other=0)
    tiles = (ends - starts + BLOCK_M - 1) // BLOCK_M                           # [SEG_P2]
    tile_end = tl.cumsum(tiles, axis=0)                                        # inclusive
    seg = tl.sum((tile_end <= tile).to(tl.int32), axis=0)                      # first seg with end > tile
    tile_begin = tl.sum(tl.where(offs == seg, tile_end - tiles, 0), axis=0)
    seg_lo = tl.sum(tl.where(offs == seg, starts, 0), axis=0)
    seg_hi = tl.sum(tl.where(offs == seg, ends, 0), axis=0)
    lo = seg_lo + (tile - tile_begin) * BLOCK_M
    hi = tl.minimum(lo + BLOCK_M, seg_hi)
    hi = tl.where(seg < NUM_SEG, hi, lo)                                       # spare slot: empty
    return seg - 1, lo, hi


@triton.jit
def _bitdelta_kernel(
    x_ptr, w_ptr, p_ptr, a_ptr, bias_ptr, y_ptr,        # x[M,K] W[N,K] packed[D,N,KB] alpha[D,N] bias[N] y[M,N]
    perm_ptr, seg_ptr, slot_ptr, ws_ptr, cnt_ptr,       # grouping (int32) and split-K workspace
    M, N, K, KB, NUM_SEG,
    stride_xm, stride_wn, stride_pd, stride_pn, stride_ad, stride_ym,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, ROW_MODE: tl.constexpr, NSLOT: tl.constexpr, SEG_P2: tl.constexpr,
    HAS_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    dtype = w_ptr.dtype.element_ty

    # ---- which rows this program owns -------------------------------------------------------
    if ROW_MODE == 0:
        row_lo = pid_m * BLOCK_M
        row_hi = tl.minimum(row_lo + BLOCK_M, M)
        delta0 = 0
    elif ROW_MODE == 1:
        delta0, row_lo, row_hi = _segment_of_tile(seg_ptr, pid_m, NUM_SEG, BLOCK_M, SEG_P2)
    else:
        row_lo = 0
        row_hi = M
        delta0 = 0
    if row_hi <= row_lo:
        return                                           # spare slot of a fixed grid

    offs_r = row_lo + tl.arange(0, BLOCK_M)              # positions in (sorted) row order
    row_ok = offs_r < row_hi
    if ROW_MODE == 0:
        rows = offs_r
    else:
        rows = tl.load(perm_ptr + offs_r, mask=row_ok, other=0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N

    # Row offsets in int64 once, so K offsets inside the loop stay 32-bit.
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm                 # [BLOCK_M, 1]
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn               # [BLOCK_N, 1]
    p_offs = offs_n.to(tl.int64)[:, None] * stride_pn                       # [BLOCK_N, 1]
    if ROW_MODE == 1:
        # Liveness folded into the bounds (base rows read no bits): scalar & tensor masks trip the
        # interpreter, comparisons do not.
        kb_lim = tl.where(delta0 >= 0, KB, 0)
        p_rows = p_ptr + delta0.to(tl.int64) * stride_pd + p_offs
        alpha = tl.load(a_ptr + delta0 * stride_ad + offs_n, mask=offs_n < tl.where(delta0 >= 0, N, 0),
                        other=0.0).to(dtype)
    else:
        kb_lim = KB
        p_rows = p_ptr + p_offs
        alpha = tl.load(a_ptr + offs_n, mask=n_ok, other=0.0).to(dtype)

    # ---- K loop ---------------------------------------------------------------------------------
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K           # byte aligned splits
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < k_end
        offs_b = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        w = tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_rows + offs_k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        xt = tl.trans(x)                                                     # [BLOCK_K, BLOCK_M]
        if ROW_MODE != 2:
            p = tl.load(p_rows + offs_b[None, :], mask=n_ok[:, None] & (offs_b < kb_lim)[None, :], other=0)
            w_eff = w + _signed_alpha(p, alpha, BLOCK_N, BLOCK_K)          # α = 0 on base rows
            acc = tl.dot(w_eff, xt, acc, input_precision=DOT_PRECISION)
        else:
            # One W tile, NSLOT deltas: each slot's bits are read once and meet only its rows.
            for i in tl.static_range(NSLOT):
                d = tl.load(slot_ptr + 3 * i)
                lo = tl.load(slot_ptr + 3 * i + 1)
                hi = tl.load(slot_ptr + 3 * i + 2)
                live = (hi > lo) & (d >= 0)
                n_lim = tl.where(live, N, 0)
                p = tl.load(p_ptr + d.to(tl.int64) * stride_pd + p_offs + offs_b[None, :],
                            mask=(offs_n < n_lim)[:, None] & (offs_b < KB)[None, :], other=0)
                a_i = tl.load(a_ptr + d * stride_ad + offs_n, mask=offs_n < n_lim, other=0.0).to(dtype)
                in_slot = (offs_r >= lo) & (offs_r < hi)
                x_i = tl.where(in_slot[None, :], xt, 0.0)
                w_eff = w + _signed_alpha(p, a_i, BLOCK_N, BLOCK_K)
                acc = tl.dot(w_eff, x_i, acc, input_precision=DOT_PRECISION)

    # ---- epilogue -------------------------------------------------------------------------------
    y_ptrs = y_ptr + rows.to(tl.int64)[None, :] * stride_ym + offs_n[:, None]   # [BLOCK_N, BLOCK_M]
    out_ok = n_ok[:, None] & row_ok[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_ok)
    else:
        # Split-K fixup: add the partial tile into the fp32 workspace, take a ticket; the last
        # program reads the sum back (an atomic read, so it comes from L2, not a stale L1 line)
        # and zeroes the tile, so the next launch finds zeros without a memset.
        offs_t = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        ws_tile = ws_ptr + pid_n * (BLOCK_N * BLOCK_M) + offs_t
        tl.atomic_add(ws_tile, acc, sem="relaxed")
        tl.debug_barrier()                               # every thread's partial issued before the ticket
        ticket = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if ticket == SPLIT_K - 1:
            zeros = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            total = tl.atomic_add(ws_tile, zeros, sem="acq_rel")
            tl.store(ws_tile, zeros)
            if HAS_BIAS:
                total += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=out_ok)
            tl.atomic_xchg(cnt_ptr + pid_n, 0, sem="relaxed")
