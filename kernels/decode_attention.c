/* Attention of one new query per row over the cached keys and values (a decode step), fp32.
 *
 * out[b, h] = softmax(scale · q[b, h]·K[b, h/G]ᵀ + mask[b]) · V[b, h/G], G = H / H_kv query heads
 * per KV head (grouped-query attention: each KV head's keys are read once for its G queries).
 * torch's SDPA handles one query per row in ~40 µs per layer at a hundred cached positions, most
 * of it set-up around a few microseconds of arithmetic.
 *
 * q [B, H, D]: element (b, h, d) at b·q_stride + h·D + d; out [B, H, D] contiguous; keys and
 * values: element (b, j, l, d) at b·batch_stride + j·head_stride + l·D + d (views of the static
 * cache's buffers); mask: additive, element (b, l) at b·mask_stride + l. D a multiple of 16, at most 256. Returns 0; -1 when it could not allocate its
 * scratch, -2 for a D it does not take (nothing written then).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define MAX_DIM 256
#define MAX_GROUP 64

int zenedge_decode_attention(const float *q, const float *keys, const float *values, const float *mask,
                             float *out, int64_t B, int64_t H, int64_t H_kv, int64_t L, int64_t D,
                             int64_t q_stride, int64_t batch_stride, int64_t head_stride, int64_t mask_stride,
                             float scale) {
    const int64_t G = H / H_kv, chunks = D / 16;
    if (D % 16 || D > MAX_DIM || G > MAX_GROUP || H % H_kv)
        return -2;
    float *scores = malloc((size_t)(G * L) * sizeof(float));
    if (!scores)
        return -1;
    for (int64_t b = 0; b < B; b++) {
        const float *row_mask = mask + b * mask_stride;
        for (int64_t j = 0; j < H_kv; j++) {
            const float *k = keys + b * batch_stride + j * head_stride;
            const float *v = values + b * batch_stride + j * head_stride;
            const float *qs = q + b * q_stride + j * G * D;
            float *os = out + (b * H + j * G) * D;
            /* scores, and each query's maximum */
            float peak[MAX_GROUP];
            for (int64_t i = 0; i < G; i++)
                peak[i] = -INFINITY;
            for (int64_t l = 0; l < L; l++) {
                __m512 kl[MAX_DIM / 16];
                for (int64_t c = 0; c < chunks; c++)
                    kl[c] = _mm512_loadu_ps(k + l * D + 16 * c);
                for (int64_t i = 0; i < G; i++) {
                    __m512 dot = _mm512_setzero_ps();
                    for (int64_t c = 0; c < chunks; c++)
                        dot = _mm512_fmadd_ps(_mm512_loadu_ps(qs + i * D + 16 * c), kl[c], dot);
                    float s = _mm512_reduce_add_ps(dot) * scale + row_mask[l];
                    scores[i * L + l] = s;
                    peak[i] = s > peak[i] ? s : peak[i];
                }
            }
            /* softmax weights, then the weighted sum of values */
            for (int64_t i = 0; i < G; i++) {
                float total = 0.0f;
                for (int64_t l = 0; l < L; l++) {
                    float e = peak[i] == -INFINITY ? 0.0f : expf(scores[i * L + l] - peak[i]);
                    scores[i * L + l] = e;
                    total += e;
                }
                const float norm = total > 0.0f ? 1.0f / total : 0.0f;
                for (int64_t l = 0; l < L; l++)
                    scores[i * L + l] *= norm;
            }
            __m512 acc[MAX_DIM / 16];
            for (int64_t i = 0; i < G; i++) {
                for (int64_t c = 0; c < chunks; c++)
                    acc[c] = _mm512_setzero_ps();
                for (int64_t l = 0; l < L; l++) {
                    const __m512 p = _mm512_set1_ps(scores[i * L + l]);
                    for (int64_t c = 0; c < chunks; c++)
                        acc[c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(v + l * D + 16 * c), acc[c]);
                }
                for (int64_t c = 0; c < chunks; c++)
                    _mm512_storeu_ps(os + i * D + 16 * c, acc[c]);
            }
        }
    }
    free(scores);
    return 0;
}
