/* y += α ⊙ (S·x) for a packed 1-bit BitDelta on the rows of a decode step, one CPU core.
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
 * That is the AVX-512 BF16 build. Elsewhere (AVX2, NEON, the scalar reference) a -1 flips the sign
 * bit of x's lane and the lanes add: the same odd-then-even sums as VDPBF16PS (x times ±1 is exact),
 * so every instruction set gives the same bits. Only `signs_of`, `tile` and x's form differ.
 *
 * x fp32 [M, K] with row stride ldx; signs uint8 [N, K/8]; alpha fp32 [N]; y fp32 [M, N] with row
 * stride ldy, updated in place. K a multiple of 32, at most MAX_INPUTS. Returns 0; -1 when it could
 * not allocate its scratch, -2 for a K it does not take (nothing written then).
 */
#include "lanes.h"

#define MAX_INPUTS 32768
#if defined(ZENEDGE_AVX512)
#define TILE_S 4           /* rows of S per tile */
#define TILE 4             /* rows of x per tile: 16 accumulators in registers */
#else
#define TILE_S 1           /* one row of S's lane masks (8 operations per 32 inputs) shared by 4 rows of x */
#define TILE 4
#endif

#if defined(ZENEDGE_AVX512)
typedef __m512bh x_group;   /* a group of 32 inputs of x in bf16 */
INLINE x_group x_group_of(const float *src) { return _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src)); }

/* 32 bf16 words: +1.0 where the mask's bit is set, -1.0 elsewhere */
INLINE __m512bh signs_of(const uint8_t *bytes) {
    uint32_t bits;
    memcpy(&bits, bytes, 4);
    return (__m512bh)_mm512_mask_blend_epi16((__mmask32)bits, _mm512_set1_epi16((short)0xBF80),
                                             _mm512_set1_epi16(0x3F80));
}

/* The (S row, x row) sums of R rows of S (1 to TILE_S) against MC rows of x (1 to TILE) from x row m0 */
INLINE void tile(const uint8_t *signs, int64_t row_bytes, int64_t groups, const x_group *xs, int64_t m0,
                 v16 acc[TILE_S][TILE], const int R, const int MC) {
    for (int64_t g = 0; g < groups; g++) {
        __m512bh s[TILE_S];
        for (int r = 0; r < R; r++)
            s[r] = signs_of(signs + r * row_bytes + g * 4);
        for (int i = 0; i < MC; i++) {
            const __m512bh x = xs[(m0 + i) * groups + g];
            for (int r = 0; r < R; r++)
                acc[r][i] = _mm512_dpbf16_ps(acc[r][i], x, s[r]);
        }
    }
}

#else
typedef struct { v16 even, odd; } x_group;   /* lane l: inputs 2l and 2l + 1, rounded to bf16 */
INLINE x_group x_group_of(const float *src) {
    float even[16], odd[16];
    for (int l = 0; l < 16; l++) {
        even[l] = from_bf16(to_bf16(src[2 * l]));
        odd[l] = from_bf16(to_bf16(src[2 * l + 1]));
    }
    return (x_group){v16_load(even), v16_load(odd)};
}

INLINE void tile(const uint8_t *signs, int64_t row_bytes, int64_t groups, const x_group *xs, int64_t m0,
                 v16 acc[TILE_S][TILE], const int R, const int MC) {
    for (int64_t g = 0; g < groups; g++) {
        v16 even[TILE_S], odd[TILE_S];   /* the sign bits to flip, per row of S */
        for (int r = 0; r < R; r++) {
            uint32_t bits;
            memcpy(&bits, signs + r * row_bytes + g * 4, 4);
            even[r] = v16_sign_mask(bits, 0);
            odd[r] = v16_sign_mask(bits, 1);
        }
        for (int i = 0; i < MC; i++) {
            const x_group x = xs[(m0 + i) * groups + g];
            for (int r = 0; r < R; r++)
                acc[r][i] = v16_add(v16_add(acc[r][i], v16_xor(x.odd, odd[r])), v16_xor(x.even, even[r]));
        }
    }
}
#endif

/* y[m, n] = α[n]·Σ + y[m, n] for each sum of a tile, one rounding (written out so that no compiler
   setting changes it) */
INLINE void finish(const v16 acc[TILE_S][TILE], const float *alpha, float *y, int64_t ldy, int64_t m0, int64_t n,
                   const int R, const int MC) {
    for (int r = 0; r < R; r++)
        for (int i = 0; i < MC; i++) {
            float *out = y + (m0 + i) * ldy + n + r;
            *out = fmaf(alpha[n + r], v16_sum(acc[r][i]), *out);
        }
}

INLINE void tiles(const uint8_t *s, int64_t row_bytes, int64_t groups, const x_group *xs, const float *alpha,
                  float *y, int64_t ldy, int64_t M, int64_t n, const int R) {
    for (int64_t m0 = 0; m0 < M; m0 += TILE) {
        const int MC = M - m0 >= TILE ? TILE : (int)(M - m0);
        v16 acc[TILE_S][TILE];
        for (int r = 0; r < R; r++)
            for (int i = 0; i < TILE; i++)
                acc[r][i] = v16_zero();
        switch (MC) {   /* MC constant in each call: unrolled, in registers */
        case 4: tile(s, row_bytes, groups, xs, m0, acc, R, 4); break;
        case 3: tile(s, row_bytes, groups, xs, m0, acc, R, 3); break;
        case 2: tile(s, row_bytes, groups, xs, m0, acc, R, 2); break;
        default: tile(s, row_bytes, groups, xs, m0, acc, R, 1); break;
        }
        finish(acc, alpha, y, ldy, m0, n, R, MC);
    }
}

int zenedge_sign_add(const float *x, const uint8_t *signs, const float *alpha, float *y, int64_t M, int64_t K,
                     int64_t N, int64_t ldx, int64_t ldy) {
    const int64_t groups = K / 32, row_bytes = K / 8;
    if (K % 32 || K > MAX_INPUTS)
        return -2;
    x_group *xs = scratch((size_t)(M * groups) * sizeof(x_group));
    if (!xs)
        return -1;
    for (int64_t m = 0; m < M; m++)
        for (int64_t g = 0; g < groups; g++)
            xs[m * groups + g] = x_group_of(x + m * ldx + g * 32);
    int64_t n = 0;
    for (; n + TILE_S <= N; n += TILE_S)
        tiles(signs + n * row_bytes, row_bytes, groups, xs, alpha, y, ldy, M, n, TILE_S);
    for (; n < N; n++)
        tiles(signs + n * row_bytes, row_bytes, groups, xs, alpha, y, ldy, M, n, 1);
    free(xs);
    return 0;
}
