/* RMSNorm of fp32 rows, y = x / sqrt(mean(x²) + eps) · w, in one pass per row.
 *
 * A decode step normalises 2 × layers + 1 rows of a few hundred numbers; torch's CPU rms_norm is
 * a dozen small ops, whose overhead is many times the arithmetic.
 * x, y [M, K] fp32 row-major (y may be x), w [K] fp32. Returns 0.
 */
#include "lanes.h"

int zenedge_rms_norm(const float *x, const float *w, float *y, int64_t M, int64_t K, float eps) {
    for (int64_t m = 0; m < M; m++) {
        const float *row = x + m * K;
        v16 squares = v16_zero();
        for (int64_t k = 0; k < K; k += 16) {
            const v16 v = v16_load_part(row + k, K - k);
            squares = v16_fma(v, v, squares);
        }
        const v16 r = v16_set1(1.0f / sqrtf(v16_sum(squares) / (float)K + eps));
        for (int64_t k = 0; k < K; k += 16) {
            const v16 v = v16_mul(v16_load_part(row + k, K - k), r);
            v16_store_part(y + m * K + k, v16_mul(v, v16_load_part(w + k, K - k)), K - k);
        }
    }
    return 0;
}
