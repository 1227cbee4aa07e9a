/* y = x·Wᵀ for int8 W with one fp16 scale per 32 inputs (llama.cpp's Q8_0), fp32 x and y, on the CPU:
 * the output head of an int4 model (its blocks split over the caller's threads: pool.c).
 *
 * The head is the largest weight a decode step reads (SmolLM2-135M: 49152 × 576, 57 MB in bf16,
 * 45 % of the step's bytes). In this format it is 30 MB, and for a base that came from a GGUF
 * whose embedding is Q8_0 (the embedded default base) it is the file's own numbers exactly: the
 * bf16 copy rounded them. x stays fp32 (no bf16 rounding of the activations either).
 *
 * As in int4_gemv.c, W is laid out in blocks of 16 rows, one row per fp32 lane: per input, the 16
 * rows' codes are widened to fp32 once (shared by every row of x) and each row of x adds them times
 * its input, broadcast, in one FMA; per group of 32 inputs the 16 sums are scaled by their rows'
 * scales in one more. No horizontal sums. Every (W row, x row) sum takes the same steps whatever M
 * and the rows around it (per group g in order: the even and the odd inputs' Σ q_k·x_k by FMAs in
 * input order, added, then acc += d·s_g), so a request's logits are the same alone as in a batch.
 *
 * Layout (made by zenedge/runtime/cpu_weights.py, NativeInt8Weight, through native.int8_layout):
 * codes int8 [B, K, 16], scale fp16 [B, K/32, 16] for B = ceil(N/16) blocks (rows past N: zeros);
 * x fp32 [M, K], y fp32 [M, N]. K a multiple of 32, at most MAX_INPUTS. Returns 0; -2 for a K it
 * does not take (nothing written then).
 */
#include "lanes.h"
#include "pool.h"

#define MAX_INPUTS 32768
#define ROWS 16       /* rows of W per block: a v16's lanes */
#define BLOCKS_AHEAD 2
#if defined(ZENEDGE_AVX512)
#define MAX_TILE 8    /* rows of x per pass over a block: their accumulators stay in registers */
#else
#define MAX_TILE 4
#endif

/* One block of W against MC rows of x from m0 (MC constant: unrolled, in registers); `live`: the
   block's rows that exist (the last block may be partial). */
INLINE void block(const int8_t *codes, const int8_t *ahead, const uint16_t *scale, const float *x, int64_t K,
                  int64_t m0, float *y, int64_t N, int64_t n, int64_t live, const int MC) {
    const int64_t groups = K / 32;
    v16 acc[MAX_TILE];
    for (int i = 0; i < MC; i++)
        acc[i] = v16_zero();
    for (int64_t g = 0; g < groups; g++) {
        const int8_t *c = codes + g * 32 * ROWS;
        v16 even[MAX_TILE], odd[MAX_TILE];   /* two chains per row: a chain's FMAs wait on each other */
        for (int i = 0; i < MC; i++)
            even[i] = odd[i] = v16_zero();
        for (int k = 0; k < 32; k += 2) {
            if (!(k & 3))   /* one cache line per 4 inputs, BLOCKS_AHEAD blocks ahead, into L2 */
                PREFETCH_L2(ahead + g * 32 * ROWS + k * ROWS);
            const v16 w0 = v16_from_int8(c + k * ROWS), w1 = v16_from_int8(c + (k + 1) * ROWS);
            for (int i = 0; i < MC; i++) {
                const float *xi = x + (m0 + i) * K + g * 32 + k;
                even[i] = v16_fma(w0, v16_set1(xi[0]), even[i]);
                odd[i] = v16_fma(w1, v16_set1(xi[1]), odd[i]);
            }
        }
        const v16 s = v16_from_half(scale + g * ROWS);
        for (int i = 0; i < MC; i++)
            acc[i] = v16_fma(v16_add(even[i], odd[i]), s, acc[i]);
    }
    for (int i = 0; i < MC; i++)
        v16_store_part(y + (m0 + i) * N + n, acc[i], live);
}

/* One product, for the threads (pool.c) to split by blocks of 16 output rows */
typedef struct {
    const float *x;
    const int8_t *codes;
    const uint16_t *scale;
    float *y;
    int64_t M, N, K;
} int8_job;

static void int8_blocks(const void *arg, int64_t b0, int64_t b1) {
    const int8_job *j = arg;
    const int64_t M = j->M, N = j->N, K = j->K, blocks = (N + ROWS - 1) / ROWS, block_bytes = ROWS * K,
                  block_scales = ROWS * (K / 32);
    const float *x = j->x;
    float *y = j->y;
    for (int64_t b = b0; b < b1; b++) {
        const int8_t *c = j->codes + b * block_bytes;
        const int8_t *ahead = b + BLOCKS_AHEAD < blocks ? c + BLOCKS_AHEAD * block_bytes : c;
        const uint16_t *s = j->scale + b * block_scales;
        const int64_t live = N - b * ROWS;
        for (int64_t m0 = 0; m0 < M; m0 += MAX_TILE) {
            switch (M - m0 >= MAX_TILE ? MAX_TILE : (int)(M - m0)) {
#if MAX_TILE == 8
            case 8: block(c, ahead, s, x, K, m0, y, N, b * ROWS, live, 8); break;
            case 7: block(c, ahead, s, x, K, m0, y, N, b * ROWS, live, 7); break;
            case 6: block(c, ahead, s, x, K, m0, y, N, b * ROWS, live, 6); break;
            case 5: block(c, ahead, s, x, K, m0, y, N, b * ROWS, live, 5); break;
#endif
            case 4: block(c, ahead, s, x, K, m0, y, N, b * ROWS, live, 4); break;
            case 3: block(c, ahead, s, x, K, m0, y, N, b * ROWS, live, 3); break;
            case 2: block(c, ahead, s, x, K, m0, y, N, b * ROWS, live, 2); break;
            default: block(c, ahead, s, x, K, m0, y, N, b * ROWS, live, 1); break;
            }
        }
    }
}

int zenedge_int8_gemm(const float *x, const int8_t *codes, const uint16_t *scale, float *y, int64_t M,
                      int64_t N, int64_t K) {
    if (K % 32 || K > MAX_INPUTS)
        return -2;
    const int8_job job = {x, codes, scale, y, M, N, K};
    zenedge_parallel(int8_blocks, &job, (N + ROWS - 1) / ROWS, 1);
    return 0;
}
