/* y += α ⊙ (S·x) for a packed 1-bit BitDelta on the rows of a decode step, one CPU core.
 *
 * A BitDelta variant is the base plus α[n]·S[n, k], S = ±1. Its decode product is the base's
 * (the int4 kernel, shared by every row of a step) plus this: the variant's sign bits, a quarter
 * of the int4 stream, read once per step for all the rows that use it. No dense W + α⊙S is made.
 *
 * x is rounded to int8 per group of 32 inputs (x_rows.h: the delta's product is scaled down by α,
 * so int8's 0.5-1 % of it (BENCHMARKS.md) is far below the int4 product's own rounding), and the sums are made in
 * integers: per group, Σ s·x̂ = 2·Σ_{s = +1} x̂ − Σ x̂; then A = Σ_g d_g·(Σ s·x̂)_g
 * in fp32, one fused multiply-add per group in the groups' order, and y[m, n] = α[n]·A + y[m, n].
 *   - AVX2 (and the AVX-512 build): a row's 32 bits of a group become 32 bytes 0 or 1 (a byte
 *     shuffle, a mask, a minimum), multiplied with x̂ by VPMADDUBSW, 32 products per instruction;
 *     8 rows of S are reduced together by horizontal adds, so their 8 group sums land in one
 *     vector; the bytes of a row of S serve up to TILE rows of x;
 *   - the portable loop (NEON and scalar builds) makes the same integer sums.
 * The integer sums are exact and the fp32 steps are the same on every build, so every instruction
 * set gives the same bits; every (S row, x row) sum takes the same steps whatever the other rows
 * are, so a row's numbers do not depend on its batch mates.
 *
 * x fp32 [M, K] with row stride ldx; signs uint8 [N, K/8] (bit i of byte j: input 8j + i, 1 for
 * +1: zenedge/bitdelta/packing.py); alpha fp32 [N]; y fp32 [M, N] with row stride ldy, updated in
 * place. K a multiple of 32, at most MAX_INPUTS. Returns 0; -1 when it could not allocate its
 * scratch, -2 for a K it does not take (nothing written then).
 */
#include "x_rows.h"

#define MAX_INPUTS 32768
#define TILE 4             /* rows of x per pass over 8 rows of S */

/* Rows n0..n1-1 of S against every row of x, one (S row, x row) sum at a time: the reference
   steps, and the rows AVX2's blocks of 8 leave over */
static void rows_one_by_one(const uint8_t *signs, int64_t K, const x_rows *x, const float *alpha, float *y,
                            int64_t ldy, int64_t M, int64_t n0, int64_t n1) {
    const int64_t groups = K / 32, row_bytes = K / 8;
    for (int64_t n = n0; n < n1; n++)
        for (int64_t m = 0; m < M; m++) {
            float a = 0.0f;
            for (int64_t g = 0; g < groups; g++) {
                const uint8_t *bits = signs + n * row_bytes + g * 4;
                const int8_t *codes = (const int8_t *)x->codes + m * K + g * 32;
                int32_t plus = 0;
                for (int j = 0; j < 32; j++)
                    plus += (bits[j / 8] >> (j % 8) & 1) * codes[j];
                a = fmaf((float)(2 * plus - x->sum[m * groups + g]), x->step[m * groups + g], a);
            }
            y[m * ldy + n] = fmaf(alpha[n], a, y[m * ldy + n]);
        }
}

#if defined(ZENEDGE_AVX2) || defined(ZENEDGE_AVX512)
/* 32 bytes: 1 where the group's bit is set, 0 elsewhere */
INLINE __m256i ones_of(const uint8_t *bytes) {
    int32_t bits;
    memcpy(&bits, bytes, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(bits),       /* byte k: bits byte k / 8 */
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i select = _mm256_set1_epi64x(0x8040201008040201LL);             /* byte k: 1 << k % 8 */
    return _mm256_min_epu8(_mm256_and_si256(spread, select), _mm256_set1_epi8(1));
}

/* 8 rows of S from row n against MC rows of x from row m0: acc[i] lane r = A of (S row n + r, x row m0 + i) */
INLINE void tile(const uint8_t *signs, int64_t K, const x_rows *x, int64_t n, int64_t m0, __m256 *acc,
                 const int MC) {
    const int64_t groups = K / 32, row_bytes = K / 8;
    for (int64_t g = 0; g < groups; g++) {
        __m256i ones[8];
        for (int r = 0; r < 8; r++)
            ones[r] = ones_of(signs + (n + r) * row_bytes + g * 4);
        for (int i = 0; i < MC; i++) {
            const int64_t at = (m0 + i) * groups + g;
            const __m256i codes = _mm256_loadu_si256((const __m256i *)((const int8_t *)x->codes + (m0 + i) * K + g * 32));
            __m256i p[8];
            for (int r = 0; r < 8; r++)
                p[r] = _mm256_maddubs_epi16(ones[r], codes);   /* pairs of inputs, per row of S */
            /* per 128-bit half: [row 0 .. row 7] partial sums, then the two halves added */
            const __m256i h = _mm256_hadd_epi16(_mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3])),
                                                _mm256_hadd_epi16(_mm256_hadd_epi16(p[4], p[5]), _mm256_hadd_epi16(p[6], p[7])));
            const __m128i plus = _mm_add_epi16(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            const __m256i sums = _mm256_sub_epi32(_mm256_slli_epi32(_mm256_cvtepi16_epi32(plus), 1),
                                                  _mm256_set1_epi32(x->sum[at]));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(x->step[at]), acc[i]);
        }
    }
}

static void rows_in_blocks(const uint8_t *signs, int64_t K, const x_rows *x, const float *alpha, float *y,
                           int64_t ldy, int64_t M, int64_t N) {
    for (int64_t n = 0; n + 8 <= N; n += 8)
        for (int64_t m0 = 0; m0 < M; m0 += TILE) {
            __m256 acc[TILE];
            for (int i = 0; i < TILE; i++)
                acc[i] = _mm256_setzero_ps();
            const int MC = M - m0 >= TILE ? TILE : (int)(M - m0);
            switch (MC) {   /* MC constant in each call: unrolled, in registers */
            case 4: tile(signs, K, x, n, m0, acc, 4); break;
            case 3: tile(signs, K, x, n, m0, acc, 3); break;
            case 2: tile(signs, K, x, n, m0, acc, 2); break;
            default: tile(signs, K, x, n, m0, acc, 1); break;
            }
            const __m256 a = _mm256_loadu_ps(alpha + n);
            for (int i = 0; i < MC; i++) {
                float *out = y + (m0 + i) * ldy + n;
                _mm256_storeu_ps(out, _mm256_fmadd_ps(a, acc[i], _mm256_loadu_ps(out)));
            }
        }
    rows_one_by_one(signs, K, x, alpha, y, ldy, M, N / 8 * 8, N);
}
#else
static void rows_in_blocks(const uint8_t *signs, int64_t K, const x_rows *x, const float *alpha, float *y,
                           int64_t ldy, int64_t M, int64_t N) {
    rows_one_by_one(signs, K, x, alpha, y, ldy, M, 0, N);
}
#endif

/* x [M, K] (row stride ldx) rounded as this kernel multiplies it, for zenedge_sign_add_rounded: a
   caller adding several sign slices to the same rows rounds them once (decode_step.c). 0; -1 when
   out of memory (free with x_rows_free). */
int zenedge_sign_rows(x_rows *rows, const float *x, int64_t M, int64_t K, int64_t ldx) {
    return x_rows_make(rows, x, M, K, ldx, 8, NULL);
}

int zenedge_sign_add_rounded(const x_rows *rows, const uint8_t *signs, const float *alpha, float *y, int64_t M,
                             int64_t K, int64_t N, int64_t ldy) {
    if (K % 32 || K > MAX_INPUTS)
        return -2;
    rows_in_blocks(signs, K, rows, alpha, y, ldy, M, N);
    return 0;
}

int zenedge_sign_add(const float *x, const uint8_t *signs, const float *alpha, float *y, int64_t M, int64_t K,
                     int64_t N, int64_t ldx, int64_t ldy) {
    if (K % 32 || K > MAX_INPUTS)
        return -2;
    x_rows rows;
    if (zenedge_sign_rows(&rows, x, M, K, ldx))
        return -1;
    const int status = zenedge_sign_add_rounded(&rows, signs, alpha, y, M, K, N, ldy);
    x_rows_free(&rows);
    return status;
}
