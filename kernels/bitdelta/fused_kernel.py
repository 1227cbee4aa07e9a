"""The fused BitDelta Triton kernels: y = x·(W + α⊙S)ᵀ (+b) for one or many deltas, one launch.

Sign bits are read as 32-bit words (bit j of word q of a row = element 32q + j, the byte format
of zenedge.bitdelta.pack_signs read little-endian) and expanded to ±1 two 16-bit floats at a
time: bits 2i and 2i+1 land on the two sign bits of one 32-bit register (a byte permute or a
multiply moves them there, see _sign_tile), and one XOR into the pattern of (-1, -1) gives the
pair. No shared-memory round trip: the expansion happens in the layout the consumer wants.
(ASM: the PRMT and the mask-and-XOR LOP3 as inline PTX on CUDA; plain integer ops elsewhere.)

Decode (_decode_kernel, M <= 16 rows): "swap AB", acc[BLOCK_N, BLOCK_M] = W·xᵀ with W's rows on
the MMA's M side, so one decode step still fills a 64-row wgmma tile. The base product takes W
straight from the pipelined shared-memory tile (no register work per weight at all), and each
delta adds its own product S·xᵀ with the ±1 tile in registers, into its own accumulator:
    y = W·xᵀ + Σ_slots mask_slot ⊙ α_slot ⊙ (S_slot·xᵀ)
Slot masks and α (fp32) are applied once, after the K loop, so a grouped batch reads W once, each
delta's bits once, and never re-stages x per delta. S·xᵀ is exact in fp32 (x·±1), so decode is
more precise than rounding W + α⊙S to bf16.

Prefill (_prefill_kernel): acc[BLOCK_M, BLOCK_N] = x·W_effᵀ with W_eff = W + α⊙S built in
registers (one FMA per pair) and handed to the MMA through shared memory as its B operand: x is
the A operand straight from its pipelined tile. One MMA per tile (a second ±1 product would
double the arithmetic of a compute-bound shape); the 4-warp 128 x 128 config fits two programs
per SM so one program's expansion can overlap the other's wgmma.

Row walks:
  single:        rows in order; padding rows repeat row M-1 (loads stay in bounds, no masks).
  grouped slots: (decode) all M <= 16 rows in one tile sorted by delta (perm); the NSLOT delta
                 slots (delta, lo, hi) of sorted positions, SLOTS of them unrolled inside one
                 program's K loop, SLOT_GROUPS programs per output tile.
  grouped tiles: (prefill) rows sorted by delta; each row tile belongs to one segment (delta or
                 base), assigned in-kernel from the segment offsets: fixed grid, no host sync.

SPLIT_K > 1 (decode only) splits K over programs, and slot groups split the deltas; partial
tiles meet in an fp32 workspace and the last program to arrive (atomic ticket) finishes the tile
and re-zeroes the workspace, so the op stays one launch and needs no memset.
"""

import triton
import triton.language as tl

# 32-bit patterns, as signed int32 (the kernels' integer type): two 16-bit floats per register.
_SIGN_BITS = tl.constexpr(0x80008000 - (1 << 32))     # the two sign bits
_NEG_PAIR_BF16 = tl.constexpr(0xBF80BF80 - (1 << 32))  # (-1.0, -1.0) in bf16
_NEG_PAIR_F16 = tl.constexpr(0xBC00BC00 - (1 << 32))   # (-1.0, -1.0) in fp16


@triton.jit
def _prmt(a, b, sel):
    """Byte permute (PTX prmt): result byte i = byte (sel >> 4i) & 7 of the 8 bytes {b, a}."""
    return tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, sel],
                                     dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _signed_pairs(v, neg, ASM: tl.constexpr):
    """(v & sign bits) ^ neg: one LOP3 (ptxas splits two immediates into two instructions)."""
    if ASM:
        return tl.inline_asm_elementwise("lop3.b32 $0, $1, $2, $3, 0x6a;", "=r,r,r,r", [v, _SIGN_BITS, neg],
                                         dtype=tl.int32, is_pure=True, pack=1)
    return (v & _SIGN_BITS) ^ neg


@triton.jit
def _sign_tile(words, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, dtype: tl.constexpr,
               LANES: tl.constexpr, ASM: tl.constexpr):
    """words: int32 [BLOCK_R, BLOCK_K/32] (bit j of word q: 1 = +1 for element 32q + j) -> S, ±1.

    16-bit floats are built two per 32-bit register, pair (2i, 2i+1) of a word as
    bits 2i, 2i+1 -> the sign bits 15 and 31, XOR into the pattern of (-1, -1). Which register
    moves are cheapest depends on where the consumer holds a byte's 8 elements:
      LANES: spread over the 4 lanes of a quad (the wgmma register operand, decode): shift each
             word once per lane so every byte's bit 2c (2c+1) sits at its bit 7, then one byte
             permute per pair lifts byte β to the two sign bytes (ASM: a PRMT; else shifts).
      else:  in one thread (prefill's row-major tile): spread each byte once (b·0x8001 puts bit j
             at j and j+15), then one shift per pair.
    Pairs are indexed [word, byte β, c]: element 32·word + 8β + 2c (+1).
    """
    if dtype.primitive_bitwidth == 16:
        i4 = tl.arange(0, 4)
        beta = i4[None, None, :, None]
        c = i4[None, None, None, :]
        w4 = words[:, :, None, None]                                         # [R, W, 1, 1]
        if LANES:
            even = w4 << (7 - 2 * c)                                         # bit 8β+2c   -> 8β+7
            odd = w4 << (6 - 2 * c)                                          # bit 8β+2c+1 -> 8β+7
            if ASM:
                v = _prmt(even, odd, (beta << 4) | ((beta + 4) << 12))       # bytes 1, 3 <- byte β
            else:
                v = (((even >> (8 * beta)) & 0xFF) << 8) | (((odd >> (8 * beta)) & 0xFF) << 24)
        else:
            spread = ((w4 >> (8 * beta)) & 0xFF) * 0x8001                    # [R, W, 4, 1]
            v = spread << (15 - 2 * c)                                       # bit 2c -> 15, 2c+1 -> 31
        if dtype == tl.bfloat16:
            pairs = _signed_pairs(v, _NEG_PAIR_BF16, ASM)
        else:
            pairs = _signed_pairs(v, _NEG_PAIR_F16, ASM)
        pairs = tl.reshape(pairs, [BLOCK_R, BLOCK_K // 2])
        # Low half = element 2i, high half = 2i+1: the same bits read as two 16-bit floats.
        halves = tl.join(pairs.to(tl.int16), (pairs >> 16).to(tl.int16))
        return tl.reshape(halves, [BLOCK_R, BLOCK_K]).to(dtype, bitcast=True)
    else:
        j = tl.arange(0, 32)
        bit = (words[:, :, None] >> j[None, None, :]) & 1
        return tl.reshape(tl.where(bit != 0, 1.0, -1.0), [BLOCK_R, BLOCK_K]).to(dtype)


@triton.jit
def _load_words(p_rows, q, limit, WORDS: tl.constexpr, MASKED: tl.constexpr):
    """Sign words q [BLOCK_K/32] of rows p_rows [R, 1] -> int32 [R, BLOCK_K/32].

    WORDS: p_rows points at int32 words (rows of a whole number of words; limit = words per row).
    Else p_rows points at bytes (limit = bytes per row) and each word is assembled from 4 bytes.
    MASKED: read nothing at or past `limit` (0 when a slot is dead: its rows read no bits).
    """
    if WORDS:
        if MASKED:
            return tl.load(p_rows + q[None, :], mask=q[None, :] < limit, other=0)
        return tl.load(p_rows + q[None, :])
    else:
        words = tl.zeros([p_rows.shape[0], q.shape[0]], dtype=tl.int32)
        for j in tl.static_range(4):
            b = 4 * q + j
            byte = tl.load(p_rows + b[None, :], mask=b[None, :] < limit, other=0)
            words = words | (byte.to(tl.int32) << (8 * j))
        return words


@triton.jit
def _decode_kernel(
    x_ptr, w_ptr, p_ptr, a_ptr, bias_ptr, y_ptr,        # x[M,K] W[N,K] bits[D,N,·] alpha[D,N] bias[N] y[M,N]
    perm_ptr, slot_ptr, ws_ptr, cnt_ptr,                # grouping (int32) and split-K workspace
    M, N, K, P_LIMIT, NSLOT,                            # P_LIMIT: words (WORDS) or bytes per bit row
    stride_xm, stride_wn, stride_pd, stride_pn, stride_ad, stride_ym,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    SLOTS: tl.constexpr, SLOT_GROUPS: tl.constexpr, GROUPED: tl.constexpr, WORDS: tl.constexpr,
    EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr, ASM: tl.constexpr,
):
    # Programs along axis 2 are the partial products of one output tile: SPLIT_K ranges of K times
    # SLOT_GROUPS groups of SLOTS slots (registers hold SLOTS slot accumulators at most). Only group
    # 0 reads W; the other groups read x (from L2) and their own bits.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2) % SPLIT_K
    group = tl.program_id(2) // SPLIT_K
    dtype = w_ptr.dtype.element_ty

    # ---- rows (MMA N side) and output features (MMA M side) ------------------------------------
    offs_r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)     # positions; sorted by delta when GROUPED
    row_ok = offs_r < M
    if GROUPED:
        rows = tl.load(perm_ptr + offs_r, mask=row_ok, other=0)
    else:
        rows = tl.minimum(offs_r, M - 1)                 # padding rows repeat a real one: no masks
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    n_ld = tl.minimum(offs_n, N - 1)
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm                  # [BLOCK_M, 1]
    w_rows = w_ptr + n_ld.to(tl.int64)[:, None] * stride_wn                  # [BLOCK_N, 1]
    p_rows = p_ptr + n_ld.to(tl.int64)[:, None] * stride_pn                  # [BLOCK_N, 1]

    # ---- this program's slots: delta (-1 = dead: reads no bits) and where its bits start -------
    slot_delta = (tl.zeros([], dtype=tl.int32),) * SLOTS
    if GROUPED:
        for i in tl.static_range(SLOTS):
            j = group * SLOTS + i
            d = tl.load(slot_ptr + 3 * j, mask=j < NSLOT, other=-1)
            slot_delta = slot_delta[:i] + (d,) + slot_delta[i + 1:]

    # ---- K loop ---------------------------------------------------------------------------------
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K           # whole blocks per split
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    w_limit = K
    if SLOT_GROUPS > 1:
        w_limit = tl.where(group == 0, K, 0)            # masked-off loads read no memory
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)                    # W·xᵀ, then y
    acc_s = (tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32),) * SLOTS       # S_slot·xᵀ
    for k0 in range(k_begin, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        q = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        if EVEN_K:
            x = tl.load(x_rows + offs_k[None, :])
        else:
            x = tl.load(x_rows + offs_k[None, :], mask=(offs_k < K)[None, :], other=0.0)
        if EVEN_K and SLOT_GROUPS == 1:
            w = tl.load(w_rows + offs_k[None, :])
        else:
            w = tl.load(w_rows + offs_k[None, :], mask=(offs_k < w_limit)[None, :], other=0.0)
        xt = tl.trans(x)                                                     # [BLOCK_K, BLOCK_M]
        acc = tl.dot(w, xt, acc, input_precision=DOT_PRECISION)              # W from shared memory
        for i in tl.static_range(SLOTS):
            if GROUPED:
                d = slot_delta[i]
                words = _load_words(p_rows + tl.maximum(d, 0).to(tl.int64) * stride_pd, q,
                                    tl.where(d >= 0, P_LIMIT, 0), WORDS, True)
            else:
                words = _load_words(p_rows, q, P_LIMIT, WORDS, not EVEN_K)
            s = _sign_tile(words, BLOCK_N, BLOCK_K, dtype, True, ASM)
            acc_s = acc_s[:i] + (tl.dot(s, xt, acc_s[i], input_precision=DOT_PRECISION),) + acc_s[i + 1:]

    # ---- α and slot masks, once ----------------------------------------------------------------
    if GROUPED:
        for i in tl.static_range(SLOTS):
            j = group * SLOTS + i
            d = slot_delta[i]
            lo = tl.load(slot_ptr + 3 * j + 1, mask=j < NSLOT, other=0)
            hi = tl.load(slot_ptr + 3 * j + 2, mask=j < NSLOT, other=0)
            alpha = tl.load(a_ptr + tl.maximum(d, 0) * stride_ad + offs_n,
                            mask=offs_n < tl.where(d >= 0, N, 0), other=0.0)
            in_slot = (offs_r >= lo) & (offs_r < hi)
            acc += tl.where(in_slot[None, :], alpha[:, None] * acc_s[i], 0.0)
    else:
        alpha = tl.load(a_ptr + offs_n, mask=n_ok, other=0.0)
        acc += alpha[:, None] * acc_s[0]

    # ---- epilogue -------------------------------------------------------------------------------
    y_ptrs = y_ptr + rows.to(tl.int64)[None, :] * stride_ym + offs_n[:, None]   # [BLOCK_N, BLOCK_M]
    out_ok = n_ok[:, None] & row_ok[None, :]
    if SPLIT_K * SLOT_GROUPS == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_ok)
    else:
        # Partial tiles: add into the fp32 workspace, take a ticket; the last program reads the sum
        # back (an atomic read, so it comes from L2, not a stale L1 line) and zeroes the tile, so
        # the next launch finds zeros without a memset.
        offs_t = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        ws_tile = ws_ptr + pid_n * (BLOCK_N * BLOCK_M) + offs_t
        tl.atomic_add(ws_tile, acc, sem="relaxed")
        tl.debug_barrier()                               # every thread's partial issued before the ticket
        ticket = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if ticket == SPLIT_K * SLOT_GROUPS - 1:
            zeros = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            total = tl.atomic_add(ws_tile, zeros, sem="acq_rel")
            tl.store(ws_tile, zeros)
            if HAS_BIAS:
                total += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=out_ok)
            tl.atomic_xchg(cnt_ptr + pid_n, 0, sem="relaxed")


@triton.jit
def _segment_of_tile(seg_ptr, tile, NUM_SEG, BLOCK_M: tl.constexpr, SEG_P2: tl.constexpr):
    """Grouped tiles: which segment owns row-tile slot `tile`, and its row range [lo, hi)."""
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
def _prefill_kernel(
    x_ptr, w_ptr, p_ptr, a_ptr, bias_ptr, y_ptr,        # as _decode_kernel
    perm_ptr, seg_ptr,
    M, N, K, P_LIMIT, NUM_SEG,
    stride_xm, stride_wn, stride_pd, stride_pn, stride_ad, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUPED: tl.constexpr, SEG_P2: tl.constexpr, WORDS: tl.constexpr, EVEN_K: tl.constexpr,
    OFFSETS_64: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr, ASM: tl.constexpr,
):
    # Row tiles vary fastest: the programs resident together share one W tile (read from DRAM
    # once) and walk x, which L2 holds.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    dtype = w_ptr.dtype.element_ty

    if GROUPED:
        delta, row_lo, row_hi = _segment_of_tile(seg_ptr, pid_m, NUM_SEG, BLOCK_M, SEG_P2)
    else:
        row_lo = pid_m * BLOCK_M
        row_hi = tl.minimum(row_lo + BLOCK_M, M)
        delta = 0
    if row_hi <= row_lo:
        return                                           # spare slot of a fixed grid

    offs_r = row_lo + tl.arange(0, BLOCK_M)
    row_ok = offs_r < row_hi
    if GROUPED:
        rows = tl.load(perm_ptr + offs_r, mask=row_ok, other=0)
    else:
        rows = tl.minimum(offs_r, M - 1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    n_ld = tl.minimum(offs_n, N - 1)
    if OFFSETS_64:
        x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm              # [BLOCK_M, 1]
        w_rows = w_ptr + n_ld.to(tl.int64)[:, None] * stride_wn              # [BLOCK_N, 1]
    else:
        # 32-bit offsets when x and W hold < 2**31 elements: a register per row, not two (keeps
        # the 4-warp 128 x 128 tile spill-free, so two programs share an SM).
        x_rows = x_ptr + (rows * stride_xm)[:, None]
        w_rows = w_ptr + (n_ld * stride_wn)[:, None]
    p_rows = p_ptr + tl.maximum(delta, 0).to(tl.int64) * stride_pd + n_ld.to(tl.int64)[:, None] * stride_pn
    # Base-only rows (delta -1) read no bits and add α = 0.
    p_limit = tl.where(delta >= 0, P_LIMIT, 0)
    alpha = tl.load(a_ptr + tl.maximum(delta, 0) * stride_ad + offs_n,
                    mask=offs_n < tl.where(delta >= 0, N, 0), other=0.0).to(dtype)

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        q = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        if EVEN_K:
            x = tl.load(x_rows + offs_k[None, :])
            w = tl.load(w_rows + offs_k[None, :])
        else:
            x = tl.load(x_rows + offs_k[None, :], mask=(offs_k < K)[None, :], other=0.0)
            w = tl.load(w_rows + offs_k[None, :], mask=(offs_k < K)[None, :], other=0.0)
        words = _load_words(p_rows, q, p_limit, WORDS, GROUPED or not EVEN_K)
        w_eff = w + _sign_tile(words, BLOCK_N, BLOCK_K, dtype, False, ASM) * alpha[:, None]   # one FMA per pair
        acc = tl.dot(x, tl.trans(w_eff), acc, input_precision=DOT_PRECISION)

    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rows.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]  # [BLOCK_M, BLOCK_N]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])
