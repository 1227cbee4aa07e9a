/* y = x·Wᵀ for int8 W with one fp16 scale per 32 inputs (llama.cpp's Q8_0, codes and scales in
 * two arrays), fp32 x and y, one CPU core with AVX-512: the output head of an int4 model.
 *
 * The head is the largest weight a decode step reads (SmolLM2-135M: 49152 × 576, 57 MB in bf16,
 * 45 % of the step's bytes). In this format it is 30 MB, and for a base that came from a GGUF
 * whose embedding is Q8_0 (the embedded default base) it is the file's own numbers exactly: the
 * bf16 copy rounded them. x stays fp32 (no bf16 rounding of the activations either): per group,
 * the codes are widened to fp32 and multiplied with x by FMAs, then scaled once.
 *
 * Every (W row, x row) sum takes the same steps whatever M and the rows around it: per group g in
 * order, d = q[0:16]·x[0:16] (mul), d += q[16:32]·x[16:32] (FMA), acc += d·s_g (FMA), then one
 * reduction; so a request's logits are the same alone as in a batch.
 *
 * Layout (made by zenedge/runtime/cpu_weights.py, NativeInt8Weight): codes int8 [N, K], scale
 * fp16 [N, K/32], row-major; x fp32 [M, K], y fp32 [M, N]. K a multiple of 32, at most
 * MAX_INPUTS. Returns 0; -2 for a K it does not take (nothing written then).
 */
#include <immintrin.h>
#include <stdint.h>

#define MAX_INPUTS 32768
#define MAX_GROUPS (MAX_INPUTS / 32)
#define ROWS 4        /* rows of W per block: independent FMA chains, each x slice loaded once */
#define XROWS 4       /* rows of x per pass over a block: its codes widened once for them */

/* Rows n..n+R-1 of W against rows m0..m0+MC-1 of x. Constant R and MC: inlined, unrolled. */
static inline __attribute__((always_inline)) void tile(const int8_t *codes, const float *s, const float *x,
                                                       float *y, int64_t N, int64_t K, int64_t n, int64_t m0,
                                                       const int8_t *ahead, const int R, const int MC) {
    const int64_t groups = K / 32;
    __m512 acc[ROWS][XROWS];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < MC; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m512 lo[ROWS], hi[ROWS];
        for (int r = 0; r < R; r++) {
            const int8_t *q = codes + (n + r) * K + g * 32;
            if (g % 2 == 0)   /* one cache line per two groups, 8 rows ahead, into L2 (int4_gemv.c) */
                _mm_prefetch((const char *)(ahead + r * K + g * 32), _MM_HINT_T1);
            lo[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
            hi[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
        }
        for (int i = 0; i < MC; i++) {
            const float *xm = x + (m0 + i) * K + g * 32;
            const __m512 x_lo = _mm512_loadu_ps(xm), x_hi = _mm512_loadu_ps(xm + 16);
            for (int r = 0; r < R; r++) {
                __m512 d = _mm512_fmadd_ps(hi[r], x_hi, _mm512_mul_ps(lo[r], x_lo));
                acc[r][i] = _mm512_fmadd_ps(d, _mm512_set1_ps(s[r * MAX_GROUPS + g]), acc[r][i]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < MC; i++)
            y[(m0 + i) * N + n + r] = _mm512_reduce_add_ps(acc[r][i]);
}

/* fp16 → fp32 scales of R rows into s[r * MAX_GROUPS + g] */
static inline void widen_scales(const uint16_t *scale, int64_t groups, int R, float *s) {
    for (int r = 0; r < R; r++)
        for (int64_t g = 0; g < groups; g += 16) {
            __mmask16 live = groups - g >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (groups - g)) - 1);
            __m512 v = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, scale + r * groups + g));
            _mm512_mask_storeu_ps(s + r * MAX_GROUPS + g, live, v);
        }
}

#define PASSES(R)                                                                                  \
    for (int64_t m0 = 0; m0 < M; m0 += XROWS) {                                                   \
        switch (M - m0 >= XROWS ? XROWS : (int)(M - m0)) {                                         \
        case 4: tile(codes, s, x, y, N, K, n, m0, ahead, R, 4); break;                             \
        case 3: tile(codes, s, x, y, N, K, n, m0, ahead, R, 3); break;                             \
        case 2: tile(codes, s, x, y, N, K, n, m0, ahead, R, 2); break;                             \
        default: tile(codes, s, x, y, N, K, n, m0, ahead, R, 1); break;                            \
        }                                                                                          \
    }

int zenedge_int8_gemm(const float *x, const int8_t *codes, const uint16_t *scale, float *y, int64_t M,
                      int64_t N, int64_t K) {
    const int64_t groups = K / 32;
    if (K % 32 || K > MAX_INPUTS)
        return -2;
    float s[ROWS * MAX_GROUPS];   /* the block's scales in fp32 */
    int64_t n = 0;
    for (; n + ROWS <= N; n += ROWS) {
        /* the rows two blocks ahead: streaming the head, the hardware prefetcher alone falls behind */
        const int8_t *ahead = codes + (n + 3 * ROWS <= N ? n + 2 * ROWS : n) * K;
        widen_scales(scale + n * groups, groups, ROWS, s);
        PASSES(ROWS)
    }
    for (; n < N; n++) {          /* the last N % 4 rows, one at a time: the same steps per sum */
        const int8_t *ahead = codes + n * K;
        widen_scales(scale + n * groups, groups, 1, s);
        PASSES(1)
    }
    return 0;
}
