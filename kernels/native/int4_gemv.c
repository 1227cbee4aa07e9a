/* y = x·Wᵀ for weight-only int4 W, on one CPU core with AVX-512 BF16: the decode step's matmuls.
 *
 * Decoding reads every weight once per token, so this product is bound by memory, and the job is
 * to keep up with it: torch's own int4 CPU kernel (_weight_int4pack_mm_for_cpu) unpacks at ~8 GB/s
 * on one core, under the ~14 GB/s a core streams. Here 64 weights cost about eight vector ops:
 *
 *   - 32 bytes of codes are widened to 32 words; the low and high nibbles, OR-ed with 0x4300,
 *     are exactly the bf16 numbers 128 + q (bf16 has 8 significant bits: 128..143 fit);
 *   - VDPBF16PS multiplies them with x in bf16 (the activations' rounding torch's kernel also
 *     makes), 32 products per instruction, summed in fp32;
 *   - per group of 32 inputs W = (q - 8)·s + z, so Σ x·W = s·Σ x(128 + q) + (z - 136 s)·Σ x:
 *     one FMA with the group's scale per 32 weights, and the zero terms as one short dot product
 *     per row against the group sums of x (computed once per call), which starts the row's sum.
 *
 * Decode streams every weight from memory, so bytes decide: scales and zeros stay bf16 (4 bytes
 * per 32 weights, as torch's kernel reads); fp32 copies of them were faster with the weights in
 * L2 and 10 % slower streaming a model's worth (measured, 2026-11-30).
 *
 * Layout (made by zenedge/runtime/cpu_weights.py, NativeInt4Weight):
 *   codes  uint8 [N, K/2]: for inputs 64p..64p+63 of a row, byte j (0..31) holds q[64p + j] in its
 *          low nibble and q[64p + 32 + j] in its high nibble;
 *   scale, zero  bf16 [N, K/32].
 * x fp32 [M, K] and y fp32 [M, N], row-major; K a multiple of 64, at most MAX_INPUTS. Rows of W are
 * independent, so a product over stacked weights is bit for bit the products over its parts.
 * Single-threaded. Returns 0; -1 when it could not allocate its scratch, -2 for a K it does not
 * take (nothing written then).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#define MAX_INPUTS 32768   /* K: the scale buffers below live on the stack */

#define MAX_GROUPS (MAX_INPUTS / 32)

/* Software prefetches of the weights ahead go to L2, not L1: on an AMD EPYC core, 30 layers' worth
   in 2 MB pages streamed in 4.7 ms with L1 prefetches and 4.2 ms with L2 ones (through 4 KB
   pages 5.4 ms either way), the int8 head 3.5 → 1.9 ms (2026-12-01). */
#define AHEAD _MM_HINT_T1

static inline __mmask16 live_lanes(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

/* bf16 → fp32 for 16 values (fewer where `live` says) */
static inline __m512 widen_bf16(__mmask16 live, const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, p)), 16));
}

/* One row's scales in fp32 (s) and its zero terms' factors z - 136 s */
static inline void row_scales(const uint16_t *scale, const uint16_t *zero, int64_t groups, float *s, float *z) {
    const __m512 c = _mm512_set1_ps(-136.0f);
    for (int64_t g = 0; g < groups; g += 16) {
        __mmask16 live = live_lanes(groups - g);
        __m512 sv = widen_bf16(live, scale + g);
        _mm512_mask_storeu_ps(s + g, live, sv);
        _mm512_mask_storeu_ps(z + g, live, _mm512_fmadd_ps(sv, c, widen_bf16(live, zero + g)));
    }
}

/* Σ_g z[g]·sums[g] as a vector: where a (row, x row) sum starts */
static inline __m512 zero_terms(const float *z, const float *sums, int64_t groups) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g += 16) {
        __mmask16 live = live_lanes(groups - g);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(live, z + g), _mm512_maskz_loadu_ps(live, sums + g), acc);
    }
    return acc;
}

/* For the 4-row block at row n: prefetches the scales and zeros two blocks ahead and returns
   where its codes start (the block's own codes near the end: no pointer past the end). */
static inline const uint8_t *block_ahead(const uint8_t *c, const uint16_t *scale, const uint16_t *zero, int64_t n,
                                         int64_t N, int64_t groups) {
    if (n + 12 > N)
        return c;
    for (int64_t b = 0; b < 4 * groups * 2; b += 64) {
        _mm_prefetch((const char *)(scale + (n + 8) * groups) + b, AHEAD);
        _mm_prefetch((const char *)(zero + (n + 8) * groups) + b, AHEAD);
    }
    return c + 8 * groups * 16;
}

/* R rows of W (1 or 4) against MC rows of x (1 to 4), from x row m0: each 64-weight slice is
   unpacked once for the MC rows (a batch of rows costs the unpacking once), and every (W row,
   x row) sum takes the same steps whatever R, MC and its place: the zero terms, then per slice
   s_a·(x_a·(128 + q_a)) and s_b·(x_b·(128 + q_b)) in order, then one reduction. So a row's
   product does not depend on the rows around it (stacked weights, batch mates). Constant R and
   MC: inlined and unrolled, the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(const uint8_t *codes, const uint8_t *ahead, int64_t row_bytes,
                                                       int64_t groups, const float *s, const float *z,
                                                       const __m512bh *xs, const float *sums, int64_t m0,
                                                       float *y, int64_t N, int64_t n, const int R, const int MC) {
    const __m512i nibble = _mm512_set1_epi16(0x000F), exponent = _mm512_set1_epi16(0x4300);
    __m512 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < MC; i++)
            acc[r][i] = zero_terms(z + r * MAX_GROUPS, sums + (m0 + i) * groups, groups);
    for (int64_t g = 0; g < groups; g += 2) {
        const int64_t at = g * 16;
        __m512i q_a[4], q_b[4];
        for (int r = 0; r < R; r++) {
            _mm_prefetch((const char *)(ahead + r * row_bytes + at), AHEAD);
            __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(codes + r * row_bytes + at)));
            q_a[r] = _mm512_ternarylogic_epi32(words, nibble, exponent, 0xEA);   /* (w & 0xF) | 0x4300 */
            q_b[r] = _mm512_or_si512(_mm512_srli_epi16(words, 4), exponent);     /* (w >> 4) | 0x4300 */
        }
        for (int i = 0; i < MC; i++) {
            const __m512bh x_a = xs[(m0 + i) * groups + g], x_b = xs[(m0 + i) * groups + g + 1];
            for (int r = 0; r < R; r++) {
                __m512 dot_a = _mm512_dpbf16_ps(_mm512_setzero_ps(), x_a, (__m512bh)q_a[r]);
                __m512 dot_b = _mm512_dpbf16_ps(_mm512_setzero_ps(), x_b, (__m512bh)q_b[r]);
                acc[r][i] = _mm512_fmadd_ps(dot_a, _mm512_set1_ps(s[r * MAX_GROUPS + g]), acc[r][i]);
                acc[r][i] = _mm512_fmadd_ps(dot_b, _mm512_set1_ps(s[r * MAX_GROUPS + g + 1]), acc[r][i]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < MC; i++)
            y[(m0 + i) * N + n + r] = _mm512_reduce_add_ps(acc[r][i]);
}

/* acc + s_a·(x_a · (128 + q_a)) + s_b·(x_b · (128 + q_b)) over the 64 weights at `codes` */
static inline __m512 two_groups(__m512 acc, const uint8_t *codes, __m512bh x_a, __m512bh x_b, float s_a, float s_b) {
    const __m512i nibble = _mm512_set1_epi16(0x000F), exponent = _mm512_set1_epi16(0x4300);
    __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)codes));
    __m512i q_a = _mm512_ternarylogic_epi32(words, nibble, exponent, 0xEA);    /* (w & 0xF) | 0x4300 */
    __m512i q_b = _mm512_or_si512(_mm512_srli_epi16(words, 4), exponent);     /* (w >> 4) | 0x4300 */
    __m512 dot_a = _mm512_dpbf16_ps(_mm512_setzero_ps(), x_a, (__m512bh)q_a);
    __m512 dot_b = _mm512_dpbf16_ps(_mm512_setzero_ps(), x_b, (__m512bh)q_b);
    acc = _mm512_fmadd_ps(dot_a, _mm512_set1_ps(s_a), acc);
    return _mm512_fmadd_ps(dot_b, _mm512_set1_ps(s_b), acc);
}

/* One row's groups: writes its scales in fp32 to `s_out` and returns Σ_g (z_g - 136 s_g)·sums_g
   as a vector to start the row's accumulator from. */
static inline __m512 row_start(const uint16_t *scale, const uint16_t *zero, const float *sums, int64_t groups,
                               float *s_out) {
    const __m512 c = _mm512_set1_ps(-136.0f);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g += 16) {
        __mmask16 live = groups - g >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (groups - g)) - 1);
        __m512 s = widen_bf16(live, scale + g), z = widen_bf16(live, zero + g);
        _mm512_mask_storeu_ps(s_out + g, live, s);
        acc = _mm512_fmadd_ps(_mm512_fmadd_ps(s, c, z), _mm512_maskz_loadu_ps(live, sums + g), acc);
    }
    return acc;
}

/* One row of x (a decode step): four rows of W at a time, each slice unpacked and used once, the
   zero terms folded into the scale conversion. 5-15 % faster at one row than `tile` (30 layers
   streamed), with the same steps per sum: a row's product is the same alone as in a batch. */
static void one_row_of_x(const uint8_t *codes, const uint16_t *scale, const uint16_t *zero, const __m512bh *xs,
                         const float *sums, float *y, int64_t N, int64_t groups) {
    const int64_t pairs = groups / 2, row_bytes = groups * 16;
    float s[4][MAX_GROUPS];   /* the current rows' scales in fp32 */
    int64_t n = 0;
    for (; n + 4 <= N; n += 4) {
        const uint8_t *c = codes + n * row_bytes;
        const uint8_t *ahead = block_ahead(c, scale, zero, n, N, groups);
        __m512 a0 = row_start(scale + n * groups, zero + n * groups, sums, groups, s[0]);
        __m512 a1 = row_start(scale + (n + 1) * groups, zero + (n + 1) * groups, sums, groups, s[1]);
        __m512 a2 = row_start(scale + (n + 2) * groups, zero + (n + 2) * groups, sums, groups, s[2]);
        __m512 a3 = row_start(scale + (n + 3) * groups, zero + (n + 3) * groups, sums, groups, s[3]);
        for (int64_t p = 0; p < pairs; p++) {
            const __m512bh x_a = xs[2 * p], x_b = xs[2 * p + 1];
            const int64_t at = p * 32, g = 2 * p;
            for (int r = 0; r < 4; r++)
                _mm_prefetch((const char *)(ahead + r * row_bytes + at), AHEAD);
            a0 = two_groups(a0, c + at, x_a, x_b, s[0][g], s[0][g + 1]);
            a1 = two_groups(a1, c + row_bytes + at, x_a, x_b, s[1][g], s[1][g + 1]);
            a2 = two_groups(a2, c + 2 * row_bytes + at, x_a, x_b, s[2][g], s[2][g + 1]);
            a3 = two_groups(a3, c + 3 * row_bytes + at, x_a, x_b, s[3][g], s[3][g + 1]);
        }
        y[n] = _mm512_reduce_add_ps(a0);
        y[n + 1] = _mm512_reduce_add_ps(a1);
        y[n + 2] = _mm512_reduce_add_ps(a2);
        y[n + 3] = _mm512_reduce_add_ps(a3);
    }
    for (; n < N; n++) {   /* the last N % 4 rows, one at a time */
        const uint8_t *c = codes + n * row_bytes;
        __m512 a = row_start(scale + n * groups, zero + n * groups, sums, groups, s[0]);
        for (int64_t p = 0; p < pairs; p++)
            a = two_groups(a, c + p * 32, xs[2 * p], xs[2 * p + 1], s[0][2 * p], s[0][2 * p + 1]);
        y[n] = _mm512_reduce_add_ps(a);
    }
}

#define TILES(R)                                                                                       \
    for (int64_t m0 = 0; m0 < M; m0 += 4) {                                                            \
        switch (M - m0 >= 4 ? 4 : (int)(M - m0)) {                                                     \
        case 4: tile(c, ahead, row_bytes, groups, s[0], z[0], xs, sums, m0, y, N, n, R, 4); break;    \
        case 3: tile(c, ahead, row_bytes, groups, s[0], z[0], xs, sums, m0, y, N, n, R, 3); break;    \
        case 2: tile(c, ahead, row_bytes, groups, s[0], z[0], xs, sums, m0, y, N, n, R, 2); break;    \
        default: tile(c, ahead, row_bytes, groups, s[0], z[0], xs, sums, m0, y, N, n, R, 1); break;   \
        }                                                                                              \
    }

int zenedge_int4_gemm(const float *x, const uint8_t *codes, const uint16_t *scale, const uint16_t *zero,
                      float *y, int64_t M, int64_t N, int64_t K) {
    const int64_t groups = K / 32, row_bytes = K / 2;
    if (K % 64 || K > MAX_INPUTS)
        return -2;
    __m512bh *xs = aligned_alloc(64, (size_t)(M * groups) * sizeof(__m512bh));   /* x in bf16, per group */
    float *sums = malloc((size_t)(M * groups) * sizeof(float));                   /* Σ of each group's bf16 x */
    if (!xs || !sums) {
        free(xs);
        free(sums);
        return -1;
    }
    const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3F80);                  /* bf16 1.0 */
    for (int64_t m = 0; m < M; m++) {
        for (int64_t g = 0; g < groups; g++) {
            const float *src = x + m * K + g * 32;
            __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src));   /* low half: src[0:16] */
            xs[m * groups + g] = v;
            sums[m * groups + g] = _mm512_reduce_add_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), v, ones));
        }
    }
    if (M == 1) {
        one_row_of_x(codes, scale, zero, xs, sums, y, N, groups);
        free(xs);
        free(sums);
        return 0;
    }
    float s[4][MAX_GROUPS], z[4][MAX_GROUPS];   /* the current rows' s and z - 136 s, in fp32 */
    /* Four rows of W at a time: independent accumulator chains, and each slice of x loaded once
       for the four. In both paths the rows two blocks ahead are prefetched: streaming a model's
       worth of weights, the hardware prefetcher alone left this kernel 1.3× slower (8.9 → 6.7 ms
       for 30 layers, measured with distances of 8 to 32 rows all alike, 2026-11-30). */
    int64_t n = 0;
    for (; n + 4 <= N; n += 4) {
        const uint8_t *c = codes + n * row_bytes;
        const uint8_t *ahead = block_ahead(c, scale, zero, n, N, groups);
        for (int r = 0; r < 4; r++)
            row_scales(scale + (n + r) * groups, zero + (n + r) * groups, groups, s[r], z[r]);
        TILES(4)
    }
    for (; n < N; n++) {   /* the last N % 4 rows, one at a time: the same steps per row */
        const uint8_t *c = codes + n * row_bytes, *ahead = c;
        row_scales(scale + n * groups, zero + n * groups, groups, s[0], z[0]);
        TILES(1)
    }
    free(xs);
    free(sums);
    return 0;
}
