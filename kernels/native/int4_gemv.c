/* y = x·Wᵀ for weight-only int4 W, on one CPU core: the decode step's matmuls.
 *
 * Decoding reads every weight once per token, so at one row this product is bound by memory and
 * the job is to keep up with it; at several rows (a batch of requests) the same weights serve
 * every row, and the arithmetic per row decides. So W is laid out in blocks of 16 rows, 16 rows
 * side by side in the 16 lanes of a vector, and each row of x costs one instruction per 32 weights:
 *
 *   - 32 bytes of codes are widened to 32 words; the low and high nibbles, OR-ed with 0x4300,
 *     are exactly the bf16 numbers 128 + q (bf16 has 8 significant bits: 128..143 fit), two
 *     inputs of each of the 16 rows per vector;
 *   - VDPBF16PS multiplies them with a pair of x's inputs in bf16 broadcast to every lane (the
 *     activations' rounding torch's int4 kernel also makes), summed in fp32 per lane, that is per
 *     row of W: 32 products per instruction, shared unpacking, no horizontal sums;
 *   - per group of 32 inputs W = (q - 8)·s + z, so Σ x·W = s·Σ x(128 + q) + (z - 136 s)·Σ x: per
 *     group two FMAs for 16 rows (its scales s and its zero terms against the group sum of x).
 *     The dot products of the low and the high nibbles run in two chains, added before the scale:
 *     an instruction waits on the one before in its chain, so two chains keep more of them in flight.
 *
 * Decode streams every weight from memory, so bytes decide: scales and zeros stay bf16 (4 bytes
 * per 32 weights, as torch's kernel reads).
 *
 * Layout (made by zenedge/runtime/cpu_weights.py, NativeInt4Weight), for the 16-row block b and
 * the inputs 4c..4c+3 (c = 0..K/4-1):
 *   codes  uint8 [N/16, K/4, 32]: byte 2j holds q[16b + j, 4c] in its low nibble and
 *          q[16b + j, 4c + 2] in its high one; byte 2j + 1 holds q[16b + j, 4c + 1] and
 *          q[16b + j, 4c + 3];
 *   scale, zero  bf16 [N/16, K/32, 16]: the group's scale and zero for the block's 16 rows.
 * x fp32 [M, K] and y fp32 [M, N], row-major; N a multiple of 16; K a multiple of 64, at most
 * MAX_INPUTS. Blocks of W are independent, so a product over stacked weights is bit for bit the
 * products over its parts; every (W row, x row) sum takes the same steps whatever M and the other
 * rows are, so a row's product is the same alone as in a batch. Single-threaded. Returns 0; -1
 * when it could not allocate its scratch, -2 for a shape it does not take (nothing written then).
 *
 * That is the AVX-512 BF16 build. Elsewhere (AVX2, NEON, the scalar reference) the same sums are
 * made with fp32 FMAs on lanes.h's v16: a nibble becomes the same bf16 word 0x4300 | q, widened to
 * the fp32 128 + q, and since 128 + q times a bf16 x is exact in fp32, an FMA rounds once
 * where VDPBF16PS does (which adds its odd product, then its even one: measured on this CPU), so
 * every instruction set gives the same bits. Only `block` and the nibble unpacking differ.
 */
#include "lanes.h"

#define MAX_INPUTS 32768
#define ROWS 16            /* rows of W per block: a v16's lanes */
#if defined(ZENEDGE_AVX512)
#define MAX_TILE 8         /* rows of x per pass over a block: their accumulators stay in registers */
#else
#define MAX_TILE 4
#endif

/* Software prefetches of the weights ahead go to L2, not L1: the weights stream faster so (the
   prefetch level mattered, the distance did not: BENCHMARKS.md). */
#define BLOCKS_AHEAD 2

/* The end of group g for MC rows of x: acc += (dot + dot_b)·s, acc += (z - 136 s)·Σx, with s and z
   the block's 16 scales and zeros in the lanes' order */
INLINE void end_group(v16 *acc, const v16 *dot, const v16 *dot_b, v16 s, v16 zero, const float *sums,
                      int64_t groups, int64_t m0, int64_t g, const int MC) {
    const v16 z = v16_fma(s, v16_set1(-136.0f), zero);
    for (int i = 0; i < MC; i++) {
        acc[i] = v16_fma(v16_add(dot[i], dot_b[i]), s, acc[i]);
        acc[i] = v16_fma(z, v16_set1(sums[(m0 + i) * groups + g]), acc[i]);
    }
}

#if defined(ZENEDGE_AVX512)
typedef uint16_t x_bf16;   /* x in bf16 words, read in pairs of inputs */
INLINE x_bf16 x_entry(float value) { return to_bf16(value); }

/* One block of 16 rows of W against MC rows of x from x row m0 (MC constant: unrolled, in
   registers). xs: x in bf16 [M, K]; sums: Σ of each group of bf16 x [M, K/32]. Every (W row,
   x row) sum: per group, 8 dot products into each of two fresh vectors, then acc += (a + b)·s,
   acc += (z - 136 s)·Σx; the same steps for any MC. */
INLINE void block(const uint8_t *codes, const uint8_t *ahead, const uint16_t *scale, const uint16_t *zero,
                  const x_bf16 *xs, const float *sums, int64_t K, int64_t m0, float *y, int64_t N, int64_t n,
                  const int MC) {
    const int64_t groups = K / 32, pairs = K / 2;
    const uint32_t *xp = (const uint32_t *)xs;
    const __m512i nibble = _mm512_set1_epi16(0x000F), exponent = _mm512_set1_epi16(0x4300);
    v16 acc[MAX_TILE];
    for (int i = 0; i < MC; i++)
        acc[i] = v16_zero();
    for (int64_t g = 0; g < groups; g++) {
        v16 dot[MAX_TILE], dot_b[MAX_TILE];   /* two chains per row: the low and the high nibbles */
        for (int i = 0; i < MC; i++)
            dot[i] = dot_b[i] = v16_zero();
        const uint8_t *c = codes + g * 8 * 32;
        for (int k = 0; k < 8; k++) {            /* 4 inputs of the 16 rows per step */
            if (!(k & 1))
                PREFETCH_L2(ahead + g * 8 * 32 + k * 32);
            __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(c + k * 32)));
            __m512bh q_a = (__m512bh)_mm512_ternarylogic_epi32(words, nibble, exponent, 0xEA);  /* (w & 0xF) | 0x4300 */
            __m512bh q_b = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(words, 4), exponent);    /* (w >> 4) | 0x4300 */
            const int64_t p = g * 16 + 2 * k;    /* the pair of inputs 32g + 4k, + 1 */
            for (int i = 0; i < MC; i++) {
                const uint32_t *row = xp + (m0 + i) * pairs + p;
                dot[i] = _mm512_dpbf16_ps(dot[i], (__m512bh)_mm512_set1_epi32((int)row[0]), q_a);
                dot_b[i] = _mm512_dpbf16_ps(dot_b[i], (__m512bh)_mm512_set1_epi32((int)row[1]), q_b);
            }
        }
        end_group(acc, dot, dot_b, v16_from_bf16(scale + g * ROWS), v16_from_bf16(zero + g * ROWS), sums, groups, m0,
                  g, MC);
    }
    for (int i = 0; i < MC; i++)
        v16_store(y + (m0 + i) * N + n, acc[i]);
}

#else
typedef float x_bf16;      /* x rounded to bf16, kept as fp32 */
INLINE x_bf16 x_entry(float value) { return from_bf16(to_bf16(value)); }

/* 128 + q as fp32 for the 16 rows of a block at the input 4c + t, from the 32 bytes of codes at c:
   word j (bytes 2j, 2j + 1) holds row j's four nibbles, inputs 0, 2, 1, 3 from the low end */
static const int SHIFT[4] = {0, 8, 4, 12};
static const int ORDER[4] = {1, 0, 3, 2};   /* VDPBF16PS's order: a pair's odd input, then its even one */
#if defined(ZENEDGE_AVX2)
/* AVX2 makes the 16 rows' bf16 words 128 + q as AVX-512 does, with 16-bit operations on all 16 rows
   at once, and widens them to fp32 without a shuffle (Intel cores have one port for shuffles): the
   even words shifted up, the odd ones masked in place. So the low vector holds the even rows and the
   high one the odd rows; the scales and zeros are widened the same way, and the rows are put back
   in order when stored. */
#define ROWS_SHUFFLED 1
INLINE v16 widen(__m256i words) {
    return (v16){_mm256_castsi256_ps(_mm256_slli_epi32(words, 16)),
                 _mm256_castsi256_ps(_mm256_and_si256(words, _mm256_set1_epi32((int)0xFFFF0000u)))};
}
INLINE v16 widen_bf16(const uint16_t *p) { return widen(_mm256_loadu_si256((const __m256i *)p)); }
INLINE void store_rows(float *y, v16 a) {
    const __m256 low = _mm256_unpacklo_ps(a.lo, a.hi), high = _mm256_unpackhi_ps(a.lo, a.hi);   /* rows 0-3 | 8-11, 4-7 | 12-15 */
    _mm256_storeu_ps(y, _mm256_permute2f128_ps(low, high, 0x20));
    _mm256_storeu_ps(y + 8, _mm256_permute2f128_ps(low, high, 0x31));
}
INLINE v16 nibbles(const uint8_t *c, int t) {
    const __m256i w = _mm256_loadu_si256((const __m256i *)c), nibble = _mm256_set1_epi16(0xF);
    const __m256i q = t == 3 ? _mm256_srli_epi16(w, 12) : _mm256_and_si256(_mm256_srli_epi16(w, SHIFT[t]), nibble);
    return widen(_mm256_or_si256(q, _mm256_set1_epi16(0x4300)));
}
#elif defined(ZENEDGE_NEON)
/* NEON makes the bf16 words as AVX2 does, eight rows per register, and widens them in row order */
INLINE v16 nibbles(const uint8_t *c, int t) {
    v16 q;
    for (int h = 0; h < 2; h++) {            /* rows 0-7, then 8-15 */
        const uint16x8_t w = vld1q_u16((const uint16_t *)(c + 16 * h));
        const uint16x8_t n = t == 3 ? vshrq_n_u16(w, 12) : vandq_u16(vshlq_u16(w, vdupq_n_s16((int16_t)-SHIFT[t])), vdupq_n_u16(0xF));
        const uint16x8_t words = vorrq_u16(n, vdupq_n_u16(0x4300));
        q.q[2 * h] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(words), 16));
        q.q[2 * h + 1] = vreinterpretq_f32_u32(vshll_high_n_u16(words, 16));
    }
    return q;
}
#else
INLINE v16 nibbles(const uint8_t *c, int t) {
    v16 q;
    for (int j = 0; j < 16; j++)
        q.f[j] = 128.0f + (float)((((uint32_t)c[2 * j] | (uint32_t)c[2 * j + 1] << 8) >> SHIFT[t]) & 0xF);
    return q;
}
#endif
#if !defined(ROWS_SHUFFLED)   /* lanes are rows in order */
INLINE v16 widen_bf16(const uint16_t *p) { return v16_from_bf16(p); }
INLINE void store_rows(float *y, v16 a) { v16_store(y, a); }
#endif

/* As the AVX-512 block: per input pair, acc += q·x of the odd input, then of the even one (the
   order VDPBF16PS adds in), the low and the high nibbles in two chains. */
INLINE void block(const uint8_t *codes, const uint8_t *ahead, const uint16_t *scale, const uint16_t *zero,
                  const x_bf16 *xs, const float *sums, int64_t K, int64_t m0, float *y, int64_t N, int64_t n,
                  const int MC) {
    const int64_t groups = K / 32;
    v16 acc[MAX_TILE];
    for (int i = 0; i < MC; i++)
        acc[i] = v16_zero();
    for (int64_t g = 0; g < groups; g++) {
        v16 dot[MAX_TILE], dot_b[MAX_TILE];
        for (int i = 0; i < MC; i++)
            dot[i] = dot_b[i] = v16_zero();
        for (int k = 0; k < 8; k++) {
            if (!(k & 1))
                PREFETCH_L2(ahead + g * 8 * 32 + k * 32);
            const uint8_t *c = codes + g * 8 * 32 + k * 32;
            for (int o = 0; o < 4; o++) {          /* inputs 1 then 0 into dot, 3 then 2 into dot_b */
                const int t = ORDER[o];
                const v16 q = nibbles(c, t);
                for (int i = 0; i < MC; i++) {
                    const v16 x = v16_set1(xs[(m0 + i) * K + g * 32 + 4 * k + t]);
                    if (o < 2)
                        dot[i] = v16_fma(q, x, dot[i]);
                    else
                        dot_b[i] = v16_fma(q, x, dot_b[i]);
                }
            }
        }
        end_group(acc, dot, dot_b, widen_bf16(scale + g * ROWS), widen_bf16(zero + g * ROWS), sums, groups, m0, g, MC);
    }
    for (int i = 0; i < MC; i++)
        store_rows(y + (m0 + i) * N + n, acc[i]);
}
#endif

int zenedge_int4_gemm(const float *x, const uint8_t *codes, const uint16_t *scale, const uint16_t *zero,
                      float *y, int64_t M, int64_t N, int64_t K) {
    const int64_t groups = K / 32, block_bytes = ROWS * K / 2, block_scales = ROWS * groups;
    if (K % 64 || K > MAX_INPUTS || N % ROWS)
        return -2;
    x_bf16 *xs = scratch((size_t)(M * K) * sizeof(x_bf16));
    float *sums = malloc((size_t)(M * groups) * sizeof(float));   /* Σ of each group's bf16 x */
    if (!xs || !sums) {
        free(xs);
        free(sums);
        return -1;
    }
    for (int64_t m = 0; m < M; m++)
        for (int64_t g = 0; g < groups; g++) {
            const float *src = x + m * K + g * 32;
            float pairs[16];   /* lane j: 0 + x[2j + 1] + x[2j], as a dot product with ones adds them */
            for (int j = 0; j < 32; j++)
                xs[m * K + g * 32 + j] = x_entry(src[j]);
            for (int j = 0; j < 16; j++)
                pairs[j] = (0.0f + from_bf16(to_bf16(src[2 * j + 1]))) + from_bf16(to_bf16(src[2 * j]));
            sums[m * groups + g] = v16_sum(v16_load(pairs));
        }
    for (int64_t b = 0; b < N / ROWS; b++) {
        const uint8_t *c = codes + b * block_bytes;
        /* the blocks ahead, streamed into L2 while this one is used (the hardware prefetcher alone
           falls behind the stream); the last blocks prefetch themselves */
        const uint8_t *ahead = b + BLOCKS_AHEAD < N / ROWS ? c + BLOCKS_AHEAD * block_bytes : c;
        const uint16_t *s = scale + b * block_scales, *z = zero + b * block_scales;
        for (int64_t m0 = 0; m0 < M; m0 += MAX_TILE) {
            switch (M - m0 >= MAX_TILE ? MAX_TILE : (int)(M - m0)) {
#if MAX_TILE == 8
            case 8: block(c, ahead, s, z, xs, sums, K, m0, y, N, b * ROWS, 8); break;
            case 7: block(c, ahead, s, z, xs, sums, K, m0, y, N, b * ROWS, 7); break;
            case 6: block(c, ahead, s, z, xs, sums, K, m0, y, N, b * ROWS, 6); break;
            case 5: block(c, ahead, s, z, xs, sums, K, m0, y, N, b * ROWS, 5); break;
#endif
            case 4: block(c, ahead, s, z, xs, sums, K, m0, y, N, b * ROWS, 4); break;
            case 3: block(c, ahead, s, z, xs, sums, K, m0, y, N, b * ROWS, 3); break;
            case 2: block(c, ahead, s, z, xs, sums, K, m0, y, N, b * ROWS, 2); break;
            default: block(c, ahead, s, z, xs, sums, K, m0, y, N, b * ROWS, 1); break;
            }
        }
    }
    free(xs);
    free(sums);
    return 0;
}
