#include "lanes.h"
#define ROWS 16
#define MAX_INPUTS 32768
#define MAX_TILE 4
#define BLOCKS_AHEAD 2

/* x rounded to int8 per group of 32: d = max|x|/127, q = round(x/d) */
static void quantize_row(const float *x, int64_t K, int8_t *q, float *d, float *e) {
    for (int64_t g = 0; g < K / 32; g++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) { const float a = fabsf(x[g * 32 + j]); amax = a > amax ? a : amax; }
        const float step = amax / 127.0f, inverse = step != 0.0f ? 1.0f / step : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            float r = nearbyintf(x[g * 32 + j] * inverse);
            r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
            q[g * 32 + j] = (int8_t)r;
            sum += (int)r;
        }
        d[g] = step;
        e[g] = step * (float)sum;
    }
}

INLINE void end_group(v16 *acc, const v16 *dots, v16 s, v16 zero, const float *d, const float *e, int64_t groups,
                      int64_t m0, int64_t g, const int MC) {
    const v16 zz = v16_fma(s, v16_set1(-8.0f), zero);
    for (int i = 0; i < MC; i++) {
        acc[i] = v16_fma(dots[i], v16_mul(s, v16_set1(d[(m0 + i) * groups + g])), acc[i]);
        acc[i] = v16_fma(zz, v16_set1(e[(m0 + i) * groups + g]), acc[i]);
    }
}

#if defined(ZENEDGE_AVX2) || defined(ZENEDGE_AVX512)
INLINE void block(const uint8_t *codes, const uint8_t *ahead, const uint16_t *scale, const uint16_t *zero,
                  const int8_t *xq, const float *d, const float *e, int64_t K, int64_t m0, float *y, int64_t N,
                  int64_t n, const int MC) {
    const int64_t groups = K / 32;
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    v16 acc[MAX_TILE];
    for (int i = 0; i < MC; i++) acc[i] = v16_zero();
    for (int64_t g = 0; g < groups; g++) {
        __m256i p0[MAX_TILE], p1[MAX_TILE];
        for (int i = 0; i < MC; i++) p0[i] = p1[i] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const uint8_t *cc = codes + (g * 4 + c) * 64;
            PREFETCH_L2(ahead + (g * 4 + c) * 64);
            const __m256i v0 = _mm256_loadu_si256((const __m256i *)cc), v1 = _mm256_loadu_si256((const __m256i *)(cc + 32));
            const __m256i a0 = _mm256_and_si256(v0, low), b0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low);
            const __m256i a1 = _mm256_and_si256(v1, low), b1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low);
            for (int i = 0; i < MC; i++) {
                int32_t xa, xb;
                memcpy(&xa, xq + (m0 + i) * K + g * 32 + c * 8, 4);
                memcpy(&xb, xq + (m0 + i) * K + g * 32 + c * 8 + 4, 4);
                const __m256i va = _mm256_set1_epi32(xa), vb = _mm256_set1_epi32(xb);
                p0[i] = _mm256_add_epi16(p0[i], _mm256_add_epi16(_mm256_maddubs_epi16(a0, va), _mm256_maddubs_epi16(b0, vb)));
                p1[i] = _mm256_add_epi16(p1[i], _mm256_add_epi16(_mm256_maddubs_epi16(a1, va), _mm256_maddubs_epi16(b1, vb)));
            }
        }
        v16 dots[MAX_TILE];
        for (int i = 0; i < MC; i++)
            dots[i] = (v16){_mm256_cvtepi32_ps(_mm256_madd_epi16(p0[i], ones)), _mm256_cvtepi32_ps(_mm256_madd_epi16(p1[i], ones))};
        end_group(acc, dots, v16_from_bf16(scale + g * ROWS), v16_from_bf16(zero + g * ROWS), d, e, groups, m0, g, MC);
    }
    for (int i = 0; i < MC; i++) v16_store(y + (m0 + i) * N + n, acc[i]);
}
#else
INLINE void block(const uint8_t *codes, const uint8_t *ahead, const uint16_t *scale, const uint16_t *zero,
                  const int8_t *xq, const float *d, const float *e, int64_t K, int64_t m0, float *y, int64_t N,
                  int64_t n, const int MC) {
    const int64_t groups = K / 32;
    (void)ahead;
    v16 acc[MAX_TILE];
    for (int i = 0; i < MC; i++) acc[i] = v16_zero();
    for (int64_t g = 0; g < groups; g++) {
        v16 dots[MAX_TILE];
        for (int i = 0; i < MC; i++) {
            const int8_t *x = xq + (m0 + i) * K + g * 32;
            float sums[16];
            for (int r = 0; r < 16; r++) {
                int32_t s = 0;
                for (int c = 0; c < 4; c++)
                    for (int t = 0; t < 4; t++) {
                        const uint8_t b = codes[(g * 4 + c) * 64 + 4 * r + t];
                        s += (int32_t)(b & 0xF) * x[c * 8 + t] + (int32_t)(b >> 4) * x[c * 8 + 4 + t];
                    }
                sums[r] = (float)s;
            }
            dots[i] = v16_load(sums);
        }
        end_group(acc, dots, v16_from_bf16(scale + g * ROWS), v16_from_bf16(zero + g * ROWS), d, e, groups, m0, g, MC);
    }
    for (int i = 0; i < MC; i++) v16_store(y + (m0 + i) * N + n, acc[i]);
}
#endif

int zenedge_int4_q8_gemm(const float *x, const uint8_t *codes, const uint16_t *scale, const uint16_t *zero,
                         float *y, int64_t M, int64_t N, int64_t K) {
    const int64_t groups = K / 32, block_bytes = ROWS * K / 2, block_scales = ROWS * groups;
    if (K % 64 || K > MAX_INPUTS || N % ROWS) return -2;
    int8_t *xq = scratch((size_t)(M * K));
    float *d = malloc((size_t)(M * groups) * 2 * sizeof(float));
    if (!xq || !d) { free(xq); free(d); return -1; }
    float *e = d + M * groups;
    for (int64_t m = 0; m < M; m++) quantize_row(x + m * K, K, xq + m * K, d + m * groups, e + m * groups);
    for (int64_t b = 0; b < N / ROWS; b++) {
        const uint8_t *c = codes + b * block_bytes;
        const uint8_t *ahead = b + BLOCKS_AHEAD < N / ROWS ? c + BLOCKS_AHEAD * block_bytes : c;
        const uint16_t *s = scale + b * block_scales, *z = zero + b * block_scales;
        for (int64_t m0 = 0; m0 < M; m0 += MAX_TILE) {
            switch (M - m0 >= MAX_TILE ? MAX_TILE : (int)(M - m0)) {
            case 4: block(c, ahead, s, z, xq, d, e, K, m0, y, N, b * ROWS, 4); break;
            case 3: block(c, ahead, s, z, xq, d, e, K, m0, y, N, b * ROWS, 3); break;
            case 2: block(c, ahead, s, z, xq, d, e, K, m0, y, N, b * ROWS, 2); break;
            default: block(c, ahead, s, z, xq, d, e, K, m0, y, N, b * ROWS, 1); break;
            }
        }
    }
    free(xq); free(d);
    return 0;
}
