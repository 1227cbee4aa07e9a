/* Rows of x rounded to integers per group of 32 inputs, as the int4 and sign kernels multiply them:
 * d = max|x| / L per group, x̂ = round(x / d) to nearest even, x ≈ d·x̂, with L = 32767 (int16: the
 * int4 kernel, about 2e-5 of a product's size) or 127 (int8: the sign kernel, whose product α
 * scales down, and the int4 kernel's x8 variant, about 5e-3). Each row is rounded alone, so a row's numbers do not depend on its batch mates. A
 * group holding a NaN or an infinity gets d = NaN (its products are NaN) and x̂ = 0.
 */
#ifndef ZENEDGE_X_ROWS_H
#define ZENEDGE_X_ROWS_H
#include "lanes.h"

typedef struct {
    void *codes;        /* x̂ [M, K], int8_t or int16_t, each group's 8-input runs in the caller's order */
    float *step;        /* d [M, K/32] */
    int32_t *sum;       /* Σ x̂ per group [M, K/32] */
    uint8_t *tables;    /* the sign kernel's lookup tables of x̂ (sign_add.c's AVX2 and NEON loops), or NULL */
} x_rows;

INLINE void x_rows_free(x_rows *r) {
    free(r->codes);
    free(r->step);
    free(r->sum);
    free(r->tables);
}

/* One group of 32 inputs: its codes (from code `at` on), its step d (in *step), and Σ x̂ returned */
#if defined(ZENEDGE_AVX2) || defined(ZENEDGE_AVX512)
INLINE int32_t round_group(const float *in, float limit, const int bits, const int *order, void *codes, int64_t at,
                           float *step) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 v[4], amax = _mm256_setzero_ps();
    int finite = 1;
    for (int c = 0; c < 4; c++) {
        v[c] = _mm256_loadu_ps(in + c * 8);
        if (order)
            v[c] = _mm256_permutevar8x32_ps(v[c], _mm256_loadu_si256((const __m256i *)order));
        const __m256 a = _mm256_and_ps(v[c], magnitude);
        finite &= _mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(3.4028235e38f), _CMP_LE_OQ)) == 0xFF;
        amax = _mm256_max_ps(amax, a);
    }
    __m128 half = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    half = _mm_max_ps(half, _mm_movehl_ps(half, half));
    const float top = _mm_cvtss_f32(_mm_max_ss(half, _mm_movehdup_ps(half)));
    const float d = finite ? top / limit : NAN, inverse = finite && d != 0.0f ? 1.0f / d : 0.0f;
    *step = d;
    __m256i q[4], total = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {   /* nearest even (the default rounding mode), clamped: as nearbyintf below */
        const __m256 rounded = _mm256_round_ps(_mm256_mul_ps(v[c], _mm256_set1_ps(inverse)), _MM_FROUND_CUR_DIRECTION);
        q[c] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(rounded, _mm256_set1_ps(limit)), _mm256_set1_ps(-limit)));
        q[c] = finite ? q[c] : _mm256_setzero_si256();
        total = _mm256_add_epi32(total, q[c]);
    }
    const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8),   /* inputs 0-15 */
                  more = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);    /* inputs 16-31 */
    if (bits == 8)
        _mm256_storeu_si256((__m256i *)((int8_t *)codes + at), _mm256_permute4x64_epi64(_mm256_packs_epi16(words, more), 0xD8));
    else {
        _mm256_storeu_si256((__m256i *)((int16_t *)codes + at), words);
        _mm256_storeu_si256((__m256i *)((int16_t *)codes + at + 16), more);
    }
    __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0xB1)));
}
#else
INLINE int32_t round_group(const float *in, float limit, const int bits, const int *order, void *codes, int64_t at,
                           float *step) {
    float amax = 0.0f;
    int finite = 1;
    for (int j = 0; j < 32; j++) {
        const float a = fabsf(in[j]);
        finite &= a <= 3.4028235e38f;       /* false for NaN too */
        amax = a > amax ? a : amax;
    }
    const float d = finite ? amax / limit : NAN, inverse = finite && d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int c = 0; c < 4; c++)
        for (int j = 0; j < 8; j++) {
            const float v = in[c * 8 + (order ? order[j] : j)];
            float q = finite ? nearbyintf(v * inverse) : 0.0f;     /* |q| ≤ limit */
            q = q > limit ? limit : q < -limit ? -limit : q;
            if (bits == 8)
                ((int8_t *)codes)[at + c * 8 + j] = (int8_t)q;
            else
                ((int16_t *)codes)[at + c * 8 + j] = (int16_t)q;
            sum += (int32_t)q;
        }
    *step = d;
    return sum;
}
#endif

/* x [M, K] with row stride ldx (K a multiple of 32) rounded to `bits` (8 or 16) bits; within each
   run of 8 inputs, code j is input order[j] (order NULL: in order). 0, or -1 when out of memory.
   Inlined, so that each kernel's constant bits and order unroll its loops (at one row of x this
   rounding is a noticeable part of a product's time). */
INLINE int x_rows_make(x_rows *r, const float *x, int64_t M, int64_t K, int64_t ldx, const int bits, const int *order) {
    const int64_t groups = K / 32;
    const float limit = bits == 8 ? 127.0f : 32767.0f;
    r->tables = NULL;
    r->codes = scratch((size_t)(M * K) * (size_t)(bits / 8));
    r->step = malloc((size_t)(M * groups) * sizeof(float));
    r->sum = malloc((size_t)(M * groups) * sizeof(int32_t));
    if (!r->codes || !r->step || !r->sum) {
        x_rows_free(r);
        return -1;
    }
    for (int64_t m = 0; m < M; m++)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t at = m * groups + g;
            r->sum[at] = round_group(x + m * ldx + g * 32, limit, bits, order, r->codes, m * K + g * 32, &r->step[at]);
        }
    return 0;
}
#endif
