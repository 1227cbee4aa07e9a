/* y = x·Wᵀ for weight-only int4 W on the CPU: the decode step's matmuls.
 *
 * Decoding reads every weight once per token, so at one row this product is bound by memory and
 * the job is to keep up with it; at several rows (a batch of requests) the same weights serve
 * every row, and the arithmetic per row decides. Both ask for few instructions per weight, so the
 * products are made in integers:
 *
 *   - each row of x is rounded to int16 per group of 32 inputs (x_rows.h: d = max|x| / 32767,
 *     about 2e-5 of the product's size, finer than bf16's 2e-3: BENCHMARKS.md);
 *   - W is laid out in blocks of 16 rows, each row's codes for 8 inputs in one 32-bit word, so a
 *     shift and a mask give each row a pair of 16-bit codes per lane, and one multiply-add of
 *     16-bit pairs (AVX2's VPMADDWD) makes 16 products for 8 rows, summed exactly in 32 bits
 *     (|Σ| ≤ 32·15·32767 per group), with no horizontal sums;
 *   - per group of 32 inputs W = (q - 8)·s + z, so Σ x·W = d·s·Σ q·x̂ + (z - 8 s)·d·Σ x̂ (x̂ the
 *     codes): two FMAs per group for 16 rows.
 *
 * The integer sums are exact, and what follows is lane by lane on lanes.h's v16 in one order, so
 * every instruction set gives the same bits: AVX-512 (the AVX2 loop at twice the width), AVX2,
 * NEON, and the portable scalar loop. Decode streams every weight from memory, so
 * bytes decide: scales and zeros stay bf16 (4 bytes per 32 weights).
 *
 * Scales come in three kinds (SCALES_*), so that a GGUF file's int4 blocks are multiplied as they are:
 *   SCALES_BF16  scale and zero bf16, W = (q - 8)·s + z: zenedge's own quantizer (cpu_weights.py);
 *   SCALES_F16   scale and minimum fp16, W = q·s + m: GGUF's Q4_0 (m = -8 d) and Q4_1, bit for bit;
 *   SCALES_F32   scale and minimum fp32, W = q·s + m: GGUF's Q4_K, whose per-32 scale d·sc (fp16 times
 *                a 6-bit integer) is exact in fp32 but not in 16 bits (gguf_weights.py).
 *
 * Layout (made by native.int4_layout, for cpu_weights.NativeInt4Weight): for the 16-row block b
 * and the inputs 8c..8c+7 (c = 0..K/8-1),
 *   codes  uint8 [N/16, K/8, 64]: byte 4j + t holds q[16b + j, 8c + t] in its low nibble and
 *          q[16b + j, 8c + 4 + t] in its high one (t = 0..3); as a 32-bit word, bits 4k and
 *          16 + 4k hold inputs PAIR[2k] and PAIR[2k + 1];
 *   scale, zero  [N/16, K/32, 16] of the kind's type: the group's scale and zero for the block's 16 rows.
 * x fp32 [M, K] and y fp32 [M, N], row-major; N a multiple of 16; K a multiple of 64, at most
 * MAX_INPUTS. Blocks of W are independent, so a product over stacked weights is bit for bit the
 * products over its parts; each row of x is rounded and summed alone, so a row's product is the
 * same alone as in a batch. A group of x holding a NaN or an infinity gives NaN. The blocks are split over
 * the caller's threads (pool.c), each block on one thread: the split changes no bit.
 * Returns 0; -1 when it could not allocate its scratch, -2 for a shape it does not take (nothing
 * written then).
 */
#include "x_rows.h"
#include "pool.h"

#define MAX_INPUTS 32768
#define ROWS 16            /* rows of W per block: a v16's lanes */
#define MAX_TILE 4         /* rows of x per pass over a block: their sums stay in registers */

/* Software prefetches of the weights ahead go to L2, not L1: the weights stream faster so (the
   prefetch level mattered, the distance did not: BENCHMARKS.md). */
#define BLOCKS_AHEAD 2

/* The inputs of a run of 8 that the word's nibble pairs k = 0..3 hold: x̂ is stored in this order */
static const int PAIR[8] = {0, 2, 4, 6, 1, 3, 5, 7};

enum { SCALES_BF16 = 0, SCALES_F16 = 1, SCALES_F32 = 2 };

/* The 16 rows' scales (or zeros) of group g, as fp32 lanes */
INLINE v16 group_scales(const void *p, int64_t g, const int KIND) {
    if (KIND == SCALES_F32)
        return v16_load((const float *)p + g * ROWS);
    if (KIND == SCALES_F16)
        return v16_from_half((const uint16_t *)p + g * ROWS);
    return v16_from_bf16((const uint16_t *)p + g * ROWS);
}

/* The end of group g for MC rows of x: acc += dot·(s·d), acc += m·(d·Σ x̂), with s and m the
   block's 16 scales and minimums in the lanes' order (m = z - 8 s for SCALES_BF16) and dot the
   exact integer sums as fp32 */
INLINE void end_group(v16 *acc, const v16 *dot, v16 s, v16 zero, const x_rows *x, int64_t groups, int64_t m0,
                      int64_t g, const int MC, const int KIND) {
    const v16 z = KIND == SCALES_BF16 ? v16_fma(s, v16_set1(-8.0f), zero) : zero;
    for (int i = 0; i < MC; i++) {
        const int64_t at = (m0 + i) * groups + g;
        acc[i] = v16_fma(dot[i], v16_mul(s, v16_set1(x->step[at])), acc[i]);
        acc[i] = v16_fma(z, v16_set1(x->step[at] * (float)x->sum[at]), acc[i]);
    }
}

/* The 16 rows' sums of group g against MC rows of x, one product at a time: the scalar build's
   loops, and NEON's for int8 x. x̂ is int16 in PAIR's order (BITS 16) or int8 in order (BITS 8). */
INLINE void portable_dots(const uint8_t *codes, const uint8_t *ahead, const void *xq, int64_t K, int64_t m0,
                          int64_t g, v16 *dot, const int MC, const int BITS) {
    static const int SLOT[8] = {0, 4, 1, 5, 2, 6, 3, 7};   /* where input t of a run sits in x̂: PAIR inverted */
    PREFETCH_L2(ahead + g * 4 * 64);
    for (int i = 0; i < MC; i++) {
        const int64_t at = (m0 + i) * K + g * 32;
        float lanes[ROWS];
        for (int j = 0; j < ROWS; j++) {
            int32_t sum = 0;
            for (int c = 0; c < 4; c++)
                for (int t = 0; t < 4; t++) {
                    const uint8_t byte = codes[(g * 4 + c) * 64 + 4 * j + t];
                    const int64_t low = at + c * 8 + (BITS == 8 ? t : SLOT[t]);
                    const int64_t high = at + c * 8 + (BITS == 8 ? 4 + t : SLOT[4 + t]);
                    const int32_t a = BITS == 8 ? ((const int8_t *)xq)[low] : ((const int16_t *)xq)[low];
                    const int32_t b = BITS == 8 ? ((const int8_t *)xq)[high] : ((const int16_t *)xq)[high];
                    sum += (byte & 0xF) * a + (byte >> 4) * b;
                }
            lanes[j] = (float)sum;
        }
        dot[i] = v16_load(lanes);
    }
}

/* The 16 rows' sums of group g against MC rows of x, per instruction set. x̂ is int16 in PAIR's order
   (BITS 16: each nibble pair k of a word, shifted and masked, times x̂'s matching pair broadcast) or
   int8 in the inputs' own order (BITS 8, `runtime.activations = "int8"`: a word's low nibbles are its
   row's inputs 0-3 of the run, one per byte, and its high nibbles inputs 4-7, so a byte mask gives
   four unsigned codes per lane, multiplied by four signed x̂ at once: VNNI's VPDPBUSD, or VPMADDUBSW,
   |2·15·127| fitting 16 bits, then VPMADDWD by ones). Exact integer sums either way. */
#if defined(ZENEDGE_AVX512)
/* the 16 rows' words of 8 inputs in one vector (AVX2's loop at twice the width) */
INLINE void group_dots(const uint8_t *codes, const uint8_t *ahead, const void *xq, int64_t K, int64_t m0,
                       int64_t g, v16 *dot, const int MC, const int BITS) {
    const __m512i pairs = _mm512_set1_epi32(0x000F000F), nibbles = _mm512_set1_epi8(0x0F);
    __m512i sums[2][MAX_TILE];      /* int8 x: inputs 0-3 and 4-7 of each run, two chains per row */
    for (int i = 0; i < MC; i++)
        sums[0][i] = sums[1][i] = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        PREFETCH_L2(ahead + (g * 4 + c) * 64);
        const __m512i v = _mm512_loadu_si512((const void *)(codes + (g * 4 + c) * 64));
        if (BITS == 8) {
            const __m512i lo = _mm512_and_si512(v, nibbles), hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), nibbles);
            for (int i = 0; i < MC; i++) {
                int32_t first, second;
                memcpy(&first, (const int8_t *)xq + (m0 + i) * K + g * 32 + c * 8, 4);
                memcpy(&second, (const int8_t *)xq + (m0 + i) * K + g * 32 + c * 8 + 4, 4);
#if defined(ZENEDGE_VNNI)
                sums[0][i] = _mm512_dpbusd_epi32(sums[0][i], lo, _mm512_set1_epi32(first));
                sums[1][i] = _mm512_dpbusd_epi32(sums[1][i], hi, _mm512_set1_epi32(second));
#else
                const __m512i both = _mm512_add_epi16(_mm512_maddubs_epi16(lo, _mm512_set1_epi32(first)),
                                                      _mm512_maddubs_epi16(hi, _mm512_set1_epi32(second)));
                sums[0][i] = _mm512_add_epi32(sums[0][i], _mm512_madd_epi16(both, _mm512_set1_epi16(1)));
#endif
                IN_REGISTERS(sums[0][i]);
                IN_REGISTERS(sums[1][i]);
            }
            continue;
        }
        for (int k = 0; k < 4; k++) {
            const __m512i a = k == 3 ? _mm512_srli_epi16(v, 12) : _mm512_and_si512(_mm512_srli_epi32(v, 4 * k), pairs);
            for (int i = 0; i < MC; i++) {
                int32_t pair;
                memcpy(&pair, (const int16_t *)xq + (m0 + i) * K + g * 32 + c * 8 + 2 * k, 4);
#if defined(ZENEDGE_VNNI)   /* the multiply-add and the add in one instruction: the same sum */
                sums[0][i] = _mm512_dpwssd_epi32(sums[0][i], a, _mm512_set1_epi32(pair));
#else
                sums[0][i] = _mm512_add_epi32(sums[0][i], _mm512_madd_epi16(a, _mm512_set1_epi32(pair)));
#endif
                IN_REGISTERS(sums[0][i]);
            }
        }
    }
    for (int i = 0; i < MC; i++)
        dot[i] = _mm512_cvtepi32_ps(BITS == 8 ? _mm512_add_epi32(sums[0][i], sums[1][i]) : sums[0][i]);
}
#elif defined(ZENEDGE_AVX2)
/* Nibble pair k of every 16-bit half of v as 16-bit lanes (the top one needs only the shift) */
INLINE __m256i nibble_pair(__m256i v, int k, __m256i mask) {
    return k == 3 ? _mm256_srli_epi16(v, 12) : _mm256_and_si256(_mm256_srli_epi32(v, 4 * k), mask);
}

/* Inputs 0-3 (high: 4-7) of every 32-bit word's run as bytes (int8 x) */
INLINE __m256i nibble_bytes(__m256i v, int high, __m256i mask) {
    return _mm256_and_si256(high ? _mm256_srli_epi32(v, 4) : v, mask);
}

/* rows 0-7 and 8-15 in two vectors */
INLINE void group_dots(const uint8_t *codes, const uint8_t *ahead, const void *xq, int64_t K, int64_t m0,
                       int64_t g, v16 *dot, const int MC, const int BITS) {
    const __m256i pairs = _mm256_set1_epi32(0x000F000F), nibbles = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256i top[MAX_TILE], bottom[MAX_TILE];    /* rows 0-7, rows 8-15 */
    for (int i = 0; i < MC; i++)
        top[i] = bottom[i] = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const uint8_t *at = codes + (g * 4 + c) * 64;
        PREFETCH_L2(ahead + (g * 4 + c) * 64);
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)at), v1 = _mm256_loadu_si256((const __m256i *)(at + 32));
        if (BITS == 8) {
            const __m256i lo0 = nibble_bytes(v0, 0, nibbles), hi0 = nibble_bytes(v0, 1, nibbles);
            const __m256i lo1 = nibble_bytes(v1, 0, nibbles), hi1 = nibble_bytes(v1, 1, nibbles);
            for (int i = 0; i < MC; i++) {
                int32_t first, second;
                memcpy(&first, (const int8_t *)xq + (m0 + i) * K + g * 32 + c * 8, 4);
                memcpy(&second, (const int8_t *)xq + (m0 + i) * K + g * 32 + c * 8 + 4, 4);
                const __m256i a = _mm256_set1_epi32(first), b = _mm256_set1_epi32(second);
                const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(lo0, a), _mm256_maddubs_epi16(hi0, b));
                const __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(lo1, a), _mm256_maddubs_epi16(hi1, b));
                top[i] = _mm256_add_epi32(top[i], _mm256_madd_epi16(p0, ones));
                bottom[i] = _mm256_add_epi32(bottom[i], _mm256_madd_epi16(p1, ones));
                IN_REGISTERS(top[i]);
                IN_REGISTERS(bottom[i]);
            }
            continue;
        }
        for (int k = 0; k < 4; k++) {
            const __m256i a = nibble_pair(v0, k, pairs), b = nibble_pair(v1, k, pairs);
            for (int i = 0; i < MC; i++) {
                int32_t pair;
                memcpy(&pair, (const int16_t *)xq + (m0 + i) * K + g * 32 + c * 8 + 2 * k, 4);
                const __m256i xb = _mm256_set1_epi32(pair);
                top[i] = _mm256_add_epi32(top[i], _mm256_madd_epi16(a, xb));
                bottom[i] = _mm256_add_epi32(bottom[i], _mm256_madd_epi16(b, xb));
                IN_REGISTERS(top[i]);
                IN_REGISTERS(bottom[i]);
            }
        }
    }
    for (int i = 0; i < MC; i++)
        dot[i] = (v16){_mm256_cvtepi32_ps(top[i]), _mm256_cvtepi32_ps(bottom[i])};
}
#elif defined(ZENEDGE_NEON)
/* NEON, int16 x: four rows per register, each nibble pair k as two 16-bit lanes per row, widening
   multiplies by x̂'s pair, added pairwise into one 32-bit sum per row. int8 x: the portable loop
   (NEON's dot products are a later step). */
INLINE void group_dots(const uint8_t *codes, const uint8_t *ahead, const void *xq, int64_t K, int64_t m0,
                       int64_t g, v16 *dot, const int MC, const int BITS) {
    if (BITS == 8) {
        portable_dots(codes, ahead, xq, K, m0, g, dot, MC, 8);
        return;
    }
    PREFETCH_L2(ahead + g * 4 * 64);
    for (int i = 0; i < MC; i++) {
        int32x4_t sums[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
        for (int c = 0; c < 4; c++)
            for (int k = 0; k < 4; k++) {
                int32_t pair;
                memcpy(&pair, (const int16_t *)xq + (m0 + i) * K + g * 32 + c * 8 + 2 * k, 4);
                const int16x8_t xb = vreinterpretq_s16_s32(vdupq_n_s32(pair));
                for (int h = 0; h < 4; h++) {   /* rows 4h..4h+3 */
                    const uint32x4_t v = vld1q_u32((const uint32_t *)(codes + (g * 4 + c) * 64 + 16 * h));
                    const int16x8_t n = vreinterpretq_s16_u32(vandq_u32(vshlq_u32(v, vdupq_n_s32(-4 * k)), vdupq_n_u32(0x000F000F)));
                    const int32x4_t low = vmull_s16(vget_low_s16(n), vget_low_s16(xb)), high = vmull_high_s16(n, xb);
                    sums[h] = vaddq_s32(sums[h], vpaddq_s32(low, high));
                }
            }
        for (int h = 0; h < 4; h++)
            dot[i].q[h] = vcvtq_f32_s32(sums[h]);
    }
}
#else
/* The scalar build: the portable loop */
INLINE void group_dots(const uint8_t *codes, const uint8_t *ahead, const void *xq, int64_t K, int64_t m0,
                       int64_t g, v16 *dot, const int MC, const int BITS) {
    portable_dots(codes, ahead, xq, K, m0, g, dot, MC, BITS);
}
#endif

/* One block of 16 rows of W against MC rows of x from x row m0 (MC constant: unrolled) */
INLINE void block(const uint8_t *codes, const uint8_t *ahead, const void *scale, const void *zero,
                  const x_rows *x, int64_t K, int64_t m0, float *y, int64_t N, int64_t n, const int MC,
                  const int KIND, const int BITS) {
    const int64_t groups = K / 32;
    v16 acc[MAX_TILE], dot[MAX_TILE];
    for (int i = 0; i < MC; i++)
        acc[i] = v16_zero();
    for (int64_t g = 0; g < groups; g++) {
        group_dots(codes, ahead, x->codes, K, m0, g, dot, MC, BITS);
        end_group(acc, dot, group_scales(scale, g, KIND), group_scales(zero, g, KIND), x, groups, m0, g, MC, KIND);
    }
    for (int i = 0; i < MC; i++)
        v16_store(y + (m0 + i) * N + n, acc[i]);
}

/* One kind's pass over blocks b0..b1-1 (KIND and BITS constant: each its own copy of the loop) */
INLINE void some_blocks(const uint8_t *codes, const void *scale, const void *zero, const x_rows *rows, float *y,
                        int64_t M, int64_t N, int64_t K, int64_t b0, int64_t b1, const int KIND, const int BITS) {
    const int64_t block_bytes = ROWS * K / 2;
    const int64_t scale_bytes = ROWS * (K / 32) * (KIND == SCALES_F32 ? 4 : 2);
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *c = codes + b * block_bytes;
        /* the blocks ahead, streamed into L2 while this one is used (the hardware prefetcher alone
           falls behind the stream); the last blocks prefetch themselves */
        const uint8_t *ahead = b + BLOCKS_AHEAD < N / ROWS ? c + BLOCKS_AHEAD * block_bytes : c;
        const void *s = (const uint8_t *)scale + b * scale_bytes, *z = (const uint8_t *)zero + b * scale_bytes;
        for (int64_t m0 = 0; m0 < M; m0 += MAX_TILE) {
            switch (M - m0 >= MAX_TILE ? MAX_TILE : (int)(M - m0)) {
            case 4: block(c, ahead, s, z, rows, K, m0, y, N, b * ROWS, 4, KIND, BITS); break;
            case 3: block(c, ahead, s, z, rows, K, m0, y, N, b * ROWS, 3, KIND, BITS); break;
            case 2: block(c, ahead, s, z, rows, K, m0, y, N, b * ROWS, 2, KIND, BITS); break;
            default: block(c, ahead, s, z, rows, K, m0, y, N, b * ROWS, 1, KIND, BITS); break;
            }
        }
    }
}

/* One product, for the threads (pool.c) to split by blocks of 16 output rows */
typedef struct {
    const uint8_t *codes;
    const void *scale, *zero;
    const x_rows *rows;
    float *y;
    int64_t M, N, K, kind, bits;
} int4_job;

static void int4_blocks(const void *arg, int64_t b0, int64_t b1) {
    const int4_job *j = arg;
#define BLOCKS(KIND, BITS) some_blocks(j->codes, j->scale, j->zero, j->rows, j->y, j->M, j->N, j->K, b0, b1, KIND, BITS)
    if (j->bits == 8)
        j->kind == SCALES_F32 ? BLOCKS(SCALES_F32, 8) : j->kind == SCALES_F16 ? BLOCKS(SCALES_F16, 8) : BLOCKS(SCALES_BF16, 8);
    else
        j->kind == SCALES_F32 ? BLOCKS(SCALES_F32, 16) : j->kind == SCALES_F16 ? BLOCKS(SCALES_F16, 16) : BLOCKS(SCALES_BF16, 16);
#undef BLOCKS
}

/* The product with scales of the given kind (SCALES_*), x rounded to BITS (16: in PAIR's order;
   8: in order: group_dots); -2 also for a kind it does not know */
INLINE int product(const float *x, const uint8_t *codes, const void *scale, const void *zero, float *y, int64_t M,
                   int64_t N, int64_t K, int64_t kind, const int BITS) {
    if (K % 64 || K > MAX_INPUTS || N % ROWS || kind < SCALES_BF16 || kind > SCALES_F32)
        return -2;
    x_rows rows;
    if (x_rows_make(&rows, x, M, K, K, BITS, BITS == 8 ? NULL : PAIR))
        return -1;
    const int4_job job = {codes, scale, zero, &rows, y, M, N, K, kind, BITS};
    zenedge_parallel(int4_blocks, &job, N / ROWS, 1);
    x_rows_free(&rows);
    return 0;
}

int zenedge_int4_gemm_scaled(const float *x, const uint8_t *codes, const void *scale, const void *zero,
                             float *y, int64_t M, int64_t N, int64_t K, int64_t kind) {
    return product(x, codes, scale, zero, y, M, N, K, kind, 16);
}

/* The same product with x rounded to int8 per group of 32 (d = max|x| / 127, as llama.cpp's Q8_0
   for its 4-bit formats): twice the products per instruction, at about 4e-3 of a product's size
   instead of 2e-5 (BENCHMARKS.md: the answer loss it costs) */
int zenedge_int4_gemm_x8(const float *x, const uint8_t *codes, const void *scale, const void *zero,
                         float *y, int64_t M, int64_t N, int64_t K, int64_t kind) {
    return product(x, codes, scale, zero, y, M, N, K, kind, 8);
}

int zenedge_int4_gemm(const float *x, const uint8_t *codes, const uint16_t *scale, const uint16_t *zero,
                      float *y, int64_t M, int64_t N, int64_t K) {
    return zenedge_int4_gemm_scaled(x, codes, scale, zero, y, M, N, K, SCALES_BF16);
}
