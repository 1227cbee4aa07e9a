/* Attention of one new query per row over the cached keys and values (a decode step), fp32.
 *
 * out[b, h] = softmax(scale · q[b, h]·K[b, h/G, :n_b]ᵀ) · V[b, h/G, :n_b], G = H / H_kv query heads
 * per KV head (grouped-query attention: each KV head's keys are read once for its G queries), n_b =
 * lengths[b]: each row attends over its own first n_b cached positions, nothing after them.
 * torch's SDPA spends most of its time on one query per row in set-up, which this kernel does not
 * have (BENCHMARKS.md compares the two, alone and in the model's decode step). The softmax uses
 * lanes.h's vectorised e^x.
 *
 * A row's result depends on its own query, keys, values and length only, summed in the same order
 * whatever the other rows are or how long they are: a request decodes the same alone as in a batch
 * (the static cache starts every row at position 0, so a row's positions fall in the same lanes).
 *
 * q [B, H, D]: element (b, h, d) at b·q_stride + h·D + d; out [B, H, D] contiguous; keys and
 * values: element (b, j, l, d) at b·batch_stride + j·head_stride + l·D + d for l < L (views of the
 * static cache's buffers); lengths int64 [B], each in 1..L. D a multiple of 16, at most 256.
 * Returns 0; -1 when it could not allocate its scratch, -2 for a D or a length it does not take
 * (nothing written then).
 */
#include "lanes.h"

#define MAX_DIM 256
#define MAX_GROUP 64

int zenedge_decode_attention(const float *q, const float *keys, const float *values, const int64_t *lengths,
                             float *out, int64_t B, int64_t H, int64_t H_kv, int64_t L, int64_t D,
                             int64_t q_stride, int64_t batch_stride, int64_t head_stride, float scale) {
    const int64_t G = H / H_kv, chunks = D / 16;
    if (D % 16 || D > MAX_DIM || G > MAX_GROUP || H % H_kv)
        return -2;
    int64_t longest = 0;
    for (int64_t b = 0; b < B; b++) {
        if (lengths[b] < 1 || lengths[b] > L)
            return -2;
        longest = lengths[b] > longest ? lengths[b] : longest;
    }
    float *scores = malloc((size_t)(G * longest) * sizeof(float));
    if (!scores)
        return -1;
    for (int64_t b = 0; b < B; b++) {
        const int64_t n = lengths[b];
        for (int64_t j = 0; j < H_kv; j++) {
            const float *k = keys + b * batch_stride + j * head_stride;
            const float *v = values + b * batch_stride + j * head_stride;
            const float *qs = q + b * q_stride + j * G * D;
            float *os = out + (b * H + j * G) * D;
            /* scores, and each query's maximum */
            float peak[MAX_GROUP];
            for (int64_t i = 0; i < G; i++)
                peak[i] = -INFINITY;
            for (int64_t l = 0; l < n; l++) {
                v16 kl[MAX_DIM / 16];
                for (int64_t c = 0; c < chunks; c++)
                    kl[c] = v16_load(k + l * D + 16 * c);
                for (int64_t i = 0; i < G; i++) {
                    v16 dot = v16_zero();
                    for (int64_t c = 0; c < chunks; c++)
                        dot = v16_fma(v16_load(qs + i * D + 16 * c), kl[c], dot);
                    float s = v16_sum(dot) * scale;
                    scores[i * n + l] = s;
                    peak[i] = s > peak[i] ? s : peak[i];
                }
            }
            /* softmax weights, then the weighted sum of values */
            for (int64_t i = 0; i < G; i++) {
                float *row = scores + i * n;
                const v16 top = v16_set1(peak[i]);
                v16 total = v16_zero();
                for (int64_t l = 0; l < n; l += 16) {
                    const v16 e = v16_first(v16_exp_nonpositive(v16_sub(v16_load_part(row + l, n - l), top)), n - l);
                    v16_store_part(row + l, e, n - l);
                    total = v16_add(total, e);
                }
                const v16 norm = v16_set1(1.0f / v16_sum(total));
                for (int64_t l = 0; l < n; l += 16)
                    v16_store_part(row + l, v16_mul(v16_load_part(row + l, n - l), norm), n - l);
            }
            v16 acc[MAX_DIM / 16];
            for (int64_t i = 0; i < G; i++) {
                for (int64_t c = 0; c < chunks; c++)
                    acc[c] = v16_zero();
                for (int64_t l = 0; l < n; l++) {
                    const v16 p = v16_set1(scores[i * n + l]);
                    for (int64_t c = 0; c < chunks; c++)
                        acc[c] = v16_fma(p, v16_load(v + l * D + 16 * c), acc[c]);
                }
                for (int64_t c = 0; c < chunks; c++)
                    v16_store(os + i * D + 16 * c, acc[c]);
            }
        }
    }
    free(scores);
    return 0;
}
