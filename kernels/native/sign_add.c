/* y += α ⊙ (S·x) for a packed 1-bit BitDelta on the rows of a decode step, one CPU core, AVX-512 BF16.
 *
 * A BitDelta variant is the base plus α[n]·S[n, k], S = ±1. Its decode product is the base's
 * (the int4 kernel, shared by every row of a step) plus this: the variant's sign bits, a quarter
 * of the int4 stream, read once per step for all the rows that use it. No dense W + α⊙S is made.
 *
 *   - per 32 inputs, the 4 bytes of a row of S are a 32-bit mask (bit i: input 32g + i, LSB first,
 *     1 for +1: zenedge/bitdelta/packing.py), blended into 32 bf16 words ±1.0 once for every x row;
 *   - VDPBF16PS multiplies them with x in bf16 (the activations' rounding the int4 kernel makes),
 *     32 products per instruction, summed in fp32 straight into the (S row, x row) accumulator:
 *     α is per output, so no scale per group;
 *   - then y[m, n] = α[n]·Σ + y[m, n], one fused multiply-add.
 * Every (S row, x row) sum takes the same steps whatever the other rows are (tiles of up to 4 × 4,
 * each sum on its own accumulator, reduced once): a row's numbers do not depend on its batch mates.
 *
 * The inner loop (`signs_of`, the blend; `tile`, the dot products) is all that depends on the
 * instruction set.
 *
 * x fp32 [M, K] with row stride ldx; signs uint8 [N, K/8]; alpha fp32 [N]; y fp32 [M, N] with row
 * stride ldy, updated in place. K a multiple of 32, at most MAX_INPUTS. Returns 0; -1 when it could
 * not allocate its scratch, -2 for a K it does not take (nothing written then).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_INPUTS 32768

/* 32 bf16 words: +1.0 where the mask's bit is set, -1.0 elsewhere */
static inline __m512bh signs_of(const uint8_t *bytes) {
    uint32_t bits;
    memcpy(&bits, bytes, 4);
    return (__m512bh)_mm512_mask_blend_epi16((__mmask32)bits, _mm512_set1_epi16((short)0xBF80),
                                             _mm512_set1_epi16(0x3F80));
}

/* R rows of S (1 or 4) against MC rows of x (1 to 4) from x row m0 */
static inline __attribute__((always_inline)) void tile(const uint8_t *signs, int64_t row_bytes, int64_t groups,
                                                       const float *alpha, const __m512bh *xs, int64_t m0,
                                                       float *y, int64_t ldy, int64_t n, const int R, const int MC) {
    __m512 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < MC; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m512bh s[4];
        for (int r = 0; r < R; r++)
            s[r] = signs_of(signs + r * row_bytes + g * 4);
        for (int i = 0; i < MC; i++) {
            const __m512bh x = xs[(m0 + i) * groups + g];
            for (int r = 0; r < R; r++)
                acc[r][i] = _mm512_dpbf16_ps(acc[r][i], x, s[r]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < MC; i++) {
            float *out = y + (m0 + i) * ldy + n + r;
            /* α·Σ + y as one rounding, written out so that no compiler setting changes it */
            _mm_store_ss(out, _mm_fmadd_ss(_mm_set_ss(alpha[n + r]), _mm_set_ss(_mm512_reduce_add_ps(acc[r][i])),
                                           _mm_set_ss(*out)));
        }
}

#define TILES(R)                                                                                  \
    for (int64_t m0 = 0; m0 < M; m0 += 4) {                                                       \
        switch (M - m0 >= 4 ? 4 : (int)(M - m0)) {                                                \
        case 4: tile(s, row_bytes, groups, alpha, xs, m0, y, ldy, n, R, 4); break;              \
        case 3: tile(s, row_bytes, groups, alpha, xs, m0, y, ldy, n, R, 3); break;              \
        case 2: tile(s, row_bytes, groups, alpha, xs, m0, y, ldy, n, R, 2); break;              \
        default: tile(s, row_bytes, groups, alpha, xs, m0, y, ldy, n, R, 1); break;             \
        }                                                                                         \
    }

int zenedge_sign_add(const float *x, const uint8_t *signs, const float *alpha, float *y, int64_t M, int64_t K,
                     int64_t N, int64_t ldx, int64_t ldy) {
    const int64_t groups = K / 32, row_bytes = K / 8;
    if (K % 32 || K > MAX_INPUTS)
        return -2;
    __m512bh *xs = aligned_alloc(64, (size_t)(M * groups) * sizeof(__m512bh));   /* x in bf16, per group */
    if (!xs)
        return -1;
    for (int64_t m = 0; m < M; m++)
        for (int64_t g = 0; g < groups; g++) {
            const float *src = x + m * ldx + g * 32;
            xs[m * groups + g] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src));
        }
    int64_t n = 0;
    for (; n + 4 <= N; n += 4) {
        const uint8_t *s = signs + n * row_bytes;
        TILES(4)
    }
    for (; n < N; n++) {
        const uint8_t *s = signs + n * row_bytes;
        TILES(1)
    }
    free(xs);
    return 0;
}
