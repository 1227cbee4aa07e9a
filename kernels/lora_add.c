/* y += scale · (x·Aᵀ)·Bᵀ for a LoRA on the rows of a decode step, fp32, one CPU core, AVX-512.
 *
 * Each row of x is a different request, so a row's sums must not depend on how many rows there
 * are: BLAS takes other code paths (and summation orders) for one row than for several, and a
 * request then decoded other tokens alone than in a batch. Here every row takes the same steps:
 *   - low[k] = x·A[k] for the r rows of A: 16-lane partial sums over the inputs, then one reduction;
 *   - for 16 outputs at a time, t = Σ_k low[k]·B[n, k] in order k = 0..r-1 (one FMA per k), then
 *     y[n] = scale·t + y[n] (one FMA).
 * The 16 outputs' B values for each k are gathered once per block and reused by every row of x.
 * The product is tiny next to the int4 weights a step streams (2·r·(K + N) per row).
 *
 * x fp32 [M, K] with row stride ldx; A fp32 [r, K] and B fp32 [N, r], contiguous (PEFT's lora_A
 * and lora_B as stored); y fp32 [M, N] with row stride ldy, updated in place. r at most MAX_RANK.
 * Returns 0; -1 when it could not allocate its scratch, -2 for an r it does not take (nothing
 * written then).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#define MAX_RANK 256

static inline __mmask16 live_lanes(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

int zenedge_lora_add(const float *x, const float *a, const float *b, float *y, int64_t M, int64_t K,
                     int64_t N, int64_t r, int64_t ldx, int64_t ldy, float scale) {
    if (r < 1 || r > MAX_RANK)
        return -2;
    float *low = malloc((size_t)(M * r) * sizeof(float));   /* x·Aᵀ, [M, r] */
    if (!low)
        return -1;
    for (int64_t m = 0; m < M; m++) {
        const float *xm = x + m * ldx;
        for (int64_t k = 0; k < r; k++) {
            const float *ak = a + k * K;
            __m512 acc = _mm512_setzero_ps();
            for (int64_t i = 0; i < K; i += 16) {
                __mmask16 live = live_lanes(K - i);
                acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(live, xm + i), _mm512_maskz_loadu_ps(live, ak + i), acc);
            }
            low[m * r + k] = _mm512_reduce_add_ps(acc);
        }
    }
    const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)r));
    const __m512 factor = _mm512_set1_ps(scale);
    __m512 column[MAX_RANK];   /* B[n..n+15, k] for each k */
    for (int64_t n = 0; n < N; n += 16) {
        __mmask16 live = live_lanes(N - n);
        for (int64_t k = 0; k < r; k++)
            column[k] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, rows, b + n * r + k, 4);
        for (int64_t m = 0; m < M; m++) {
            const float *lm = low + m * r;
            __m512 t = _mm512_setzero_ps();
            for (int64_t k = 0; k < r; k++)
                t = _mm512_fmadd_ps(_mm512_set1_ps(lm[k]), column[k], t);
            float *ym = y + m * ldy + n;
            _mm512_mask_storeu_ps(ym, live, _mm512_fmadd_ps(factor, t, _mm512_maskz_loadu_ps(live, ym)));
        }
    }
    free(low);
    return 0;
}
