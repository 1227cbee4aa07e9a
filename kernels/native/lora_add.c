/* y += scale · (x·Aᵀ)·Bᵀ for a LoRA on the rows of a decode step, fp32, one CPU core.
 *
 * Each row of x is a different request, so a row's sums must not depend on how many rows there
 * are: BLAS takes other code paths (and summation orders) for one row than for several, and a
 * request then decoded other tokens alone than in a batch. Here every row takes the same steps:
 *   - low[k] = x·A[k] for the r rows of A: 16-lane partial sums over the inputs, then one reduction;
 *   - for 16 outputs at a time, t = Σ_k low[k]·Bᵀ[k, n] in order k = 0..r-1 (one FMA per k), then
 *     y[n] = scale·t + y[n] (one FMA).
 * The product is tiny next to the int4 weights a step streams (2·r·(K + N) per row), and torch's
 * one-row BLAS path takes about twice as long for it.
 *
 * x fp32 [M, K] with row stride ldx; A fp32 [r, K] (PEFT's lora_A) and Bᵀ fp32 [r, N] (lora_B
 * transposed), contiguous; y fp32 [M, N] with row stride ldy, updated in place. r at most MAX_RANK.
 * Returns 0; -1 when it could not allocate its scratch, -2 for an r it does not take (nothing
 * written then).
 */
#include "lanes.h"

#define MAX_RANK 256

int zenedge_lora_add(const float *x, const float *a, const float *bt, float *y, int64_t M, int64_t K,
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
            v16 acc = v16_zero();
            for (int64_t i = 0; i < K; i += 16)
                acc = v16_fma(v16_load_part(xm + i, K - i), v16_load_part(ak + i, K - i), acc);
            low[m * r + k] = v16_sum(acc);
        }
    }
    const v16 factor = v16_set1(scale);
    for (int64_t n = 0; n < N; n += 16) {
        for (int64_t m = 0; m < M; m++) {
            const float *lm = low + m * r;
            v16 t = v16_zero();
            for (int64_t k = 0; k < r; k++)
                t = v16_fma(v16_set1(lm[k]), v16_load_part(bt + k * N + n, N - n), t);
            float *ym = y + m * ldy + n;
            v16_store_part(ym, v16_fma(factor, t, v16_load_part(ym, N - n)), N - n);
        }
    }
    free(low);
    return 0;
}
