/* Rows of x rounded to integers per group of 32 inputs, as the int4 and sign kernels multiply them:
 * d = max|x| / L per group, x̂ = round(x / d) to nearest even, x ≈ d·x̂, with L = 32767 (int16: the
 * int4 kernel, about 2e-5 of a product's size) or 127 (int8: the sign kernel, whose product α
 * scales down). Each row is rounded alone, so a row's numbers do not depend on its batch mates. A
 * group holding a NaN or an infinity gets d = NaN (its products are NaN) and x̂ = 0.
 */
#ifndef ZENEDGE_X_ROWS_H
#define ZENEDGE_X_ROWS_H
#include "lanes.h"

typedef struct {
    void *codes;        /* x̂ [M, K], int8_t or int16_t, each group's 8-input runs in the caller's order */
    float *step;        /* d [M, K/32] */
    int32_t *sum;       /* Σ x̂ per group [M, K/32] */
} x_rows;

INLINE void x_rows_free(x_rows *r) {
    free(r->codes);
    free(r->step);
    free(r->sum);
}

/* x [M, K] with row stride ldx (K a multiple of 32) rounded to `bits` (8 or 16) bits; within each
   run of 8 inputs, code j is input order[j] (order NULL: in order). 0, or -1 when out of memory.
   Inlined, so that each kernel's constant bits and order unroll its loops (at one row of x this
   rounding is a noticeable part of a product's time). */
INLINE int x_rows_make(x_rows *r, const float *x, int64_t M, int64_t K, int64_t ldx, const int bits, const int *order) {
    const int64_t groups = K / 32;
    const float limit = bits == 8 ? 127.0f : 32767.0f;
    r->codes = scratch((size_t)(M * K) * (size_t)(bits / 8));
    r->step = malloc((size_t)(M * groups) * sizeof(float));
    r->sum = malloc((size_t)(M * groups) * sizeof(int32_t));
    if (!r->codes || !r->step || !r->sum) {
        x_rows_free(r);
        return -1;
    }
    for (int64_t m = 0; m < M; m++)
        for (int64_t g = 0; g < groups; g++) {
            const float *in = x + m * ldx + g * 32;
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
                        ((int8_t *)r->codes)[m * K + g * 32 + c * 8 + j] = (int8_t)q;
                    else
                        ((int16_t *)r->codes)[m * K + g * 32 + c * 8 + j] = (int16_t)q;
                    sum += (int32_t)q;
                }
            r->step[m * groups + g] = d;
            r->sum[m * groups + g] = sum;
        }
    return 0;
}
#endif
