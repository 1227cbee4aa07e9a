/* y = x·Wᵀ for weight-only int4 W, on one CPU core with AVX-512 BF16: the decode step's matmuls.
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
 *     The dot products of the low and the high nibbles run in two chains (an instruction waits on
 *     the one before in its chain), added before the scale: 0.85-0.91x the time of one chain.
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
 * The inner loop (`block`: the unpacking, the dot products, the scales) is all that depends on the
 * instruction set.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#define MAX_INPUTS 32768
#define ROWS 16            /* rows of W per block: the vector's fp32 lanes */
#define MAX_TILE 8         /* rows of x per pass over a block: two accumulators each stay in registers */

/* Software prefetches of the weights ahead go to L2, not L1: on an AMD EPYC core, 30 layers' worth
   in 2 MB pages streamed in 4.7 ms with L1 prefetches and 4.2 ms with L2 ones (2026-12-01). */
#define AHEAD _MM_HINT_T1
#define BLOCKS_AHEAD 2

/* bf16 → fp32 for 16 values */
static inline __m512 widen_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* One block of 16 rows of W against MC rows of x from x row m0 (MC constant: unrolled, in
   registers). xp: x in bf16 as pairs of inputs (uint32 [M, K/2]); sums: Σ of each group of bf16
   x [M, K/32]. Every (W row, x row) sum: per group, 8 dot products into each of two fresh
   vectors, then acc += (a + b)·s, acc += (z - 136 s)·Σx; the same steps for any MC. */
static inline __attribute__((always_inline)) void block(const uint8_t *codes, const uint8_t *ahead,
                                                        const uint16_t *scale, const uint16_t *zero,
                                                        const uint32_t *xp, const float *sums, int64_t K,
                                                        int64_t m0, float *y, int64_t N, int64_t n, const int MC) {
    const int64_t groups = K / 32, pairs = K / 2;
    const __m512i nibble = _mm512_set1_epi16(0x000F), exponent = _mm512_set1_epi16(0x4300);
    const __m512 c136 = _mm512_set1_ps(-136.0f);
    __m512 acc[MAX_TILE];
    for (int i = 0; i < MC; i++)
        acc[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m512 dot[MAX_TILE], dot_b[MAX_TILE];   /* two chains per row: the low and the high nibbles */
        for (int i = 0; i < MC; i++)
            dot[i] = dot_b[i] = _mm512_setzero_ps();
        const uint8_t *c = codes + g * 8 * 32;
        for (int k = 0; k < 8; k++) {            /* 4 inputs of the 16 rows per step */
            if (!(k & 1))
                _mm_prefetch((const char *)(ahead + g * 8 * 32 + k * 32), AHEAD);
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
        const __m512 s = widen_bf16(scale + g * ROWS);
        const __m512 z = _mm512_fmadd_ps(s, c136, widen_bf16(zero + g * ROWS));
        for (int i = 0; i < MC; i++) {
            acc[i] = _mm512_fmadd_ps(_mm512_add_ps(dot[i], dot_b[i]), s, acc[i]);
            acc[i] = _mm512_fmadd_ps(z, _mm512_set1_ps(sums[(m0 + i) * groups + g]), acc[i]);
        }
    }
    for (int i = 0; i < MC; i++)
        _mm512_storeu_ps(y + (m0 + i) * N + n, acc[i]);
}

int zenedge_int4_gemm(const float *x, const uint8_t *codes, const uint16_t *scale, const uint16_t *zero,
                      float *y, int64_t M, int64_t N, int64_t K) {
    const int64_t groups = K / 32, pairs = K / 2, block_bytes = ROWS * K / 2, block_scales = ROWS * groups;
    if (K % 64 || K > MAX_INPUTS || N % ROWS)
        return -2;
    uint32_t *xp = aligned_alloc(64, (size_t)(M * pairs) * sizeof(uint32_t) + 64);   /* x in bf16, in pairs */
    float *sums = malloc((size_t)(M * groups) * sizeof(float));                      /* Σ of each group's bf16 x */
    if (!xp || !sums) {
        free(xp);
        free(sums);
        return -1;
    }
    const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3F80);                     /* bf16 1.0 */
    for (int64_t m = 0; m < M; m++)
        for (int64_t g = 0; g < groups; g++) {
            const float *src = x + m * K + g * 32;
            __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src));   /* low half: src[0:16] */
            _mm512_storeu_si512(xp + m * pairs + g * 16, (__m512i)v);
            sums[m * groups + g] = _mm512_reduce_add_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), v, ones));
        }
    for (int64_t b = 0; b < N / ROWS; b++) {
        const uint8_t *c = codes + b * block_bytes;
        /* the blocks ahead, streamed into L2 while this one is used (the hardware prefetcher alone
           left a model's worth 1.3× slower, 2026-11-30); the last blocks prefetch themselves */
        const uint8_t *ahead = b + BLOCKS_AHEAD < N / ROWS ? c + BLOCKS_AHEAD * block_bytes : c;
        const uint16_t *s = scale + b * block_scales, *z = zero + b * block_scales;
        for (int64_t m0 = 0; m0 < M; m0 += MAX_TILE) {
            switch (M - m0 >= MAX_TILE ? MAX_TILE : (int)(M - m0)) {
            case 8: block(c, ahead, s, z, xp, sums, K, m0, y, N, b * ROWS, 8); break;
            case 7: block(c, ahead, s, z, xp, sums, K, m0, y, N, b * ROWS, 7); break;
            case 6: block(c, ahead, s, z, xp, sums, K, m0, y, N, b * ROWS, 6); break;
            case 5: block(c, ahead, s, z, xp, sums, K, m0, y, N, b * ROWS, 5); break;
            case 4: block(c, ahead, s, z, xp, sums, K, m0, y, N, b * ROWS, 4); break;
            case 3: block(c, ahead, s, z, xp, sums, K, m0, y, N, b * ROWS, 3); break;
            case 2: block(c, ahead, s, z, xp, sums, K, m0, y, N, b * ROWS, 2); break;
            default: block(c, ahead, s, z, xp, sums, K, m0, y, N, b * ROWS, 1); break;
            }
        }
    }
    free(xp);
    free(sums);
    return 0;
}
