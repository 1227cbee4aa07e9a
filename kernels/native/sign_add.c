/* y += α ⊙ (S·x) for a packed 1-bit BitDelta on the rows of a decode step, on the CPU (its
 * output columns split over the caller's threads: pool.c; the split changes no bit).
 *
 * A BitDelta variant is the base plus α[n]·S[n, k], S = ±1. Its decode product is the base's
 * (the int4 kernel, shared by every row of a step) plus this: the variant's sign bits, a quarter
 * of the int4 stream, read once per step for all the rows that use it. No dense W + α⊙S is made.
 *
 * x is rounded to int8 per group of 32 inputs (x_rows.h: the delta's product is scaled down by α,
 * so int8's 0.5-1 % of it (BENCHMARKS.md) is far below the int4 product's own rounding), and the sums are made in
 * integers: per group, Σ s·x̂ = 2·Σ_{s = +1} x̂ − Σ x̂; then A = Σ_g d_g·(Σ s·x̂)_g
 * in fp32, one fused multiply-add per group in the groups' order, and y[m, n] = α[n]·A + y[m, n].
 *   - AVX2 (and the AVX-512 build): lookup tables instead of multiplies. For each row of x,
 *     group and quad of 4 inputs, the 16 possible sums Σ ±x̂ are tabled once (zenedge_sign_rows,
 *     shared by every sign slice of a step); a row of S then needs one table lookup per 4 inputs:
 *     its sign bits, 4 at a time, are the index. The signs are stored by input byte (below), so
 *     32 bytes hold one byte of 32 rows, and VPSHUFB looks up 32 rows per instruction;
 *   - NEON: the same tables, TBL looking up 16 rows at once; the portable loop (the scalar
 *     build) makes the same integer sums one at a time and is the reference.
 * The integer sums are exact and the fp32 steps are the same on every build, so every instruction
 * set gives the same bits; every (S row, x row) sum takes the same steps whatever the other rows
 * are, so a row's numbers do not depend on its batch mates.
 *
 * x fp32 [M, K] with row stride ldx; signs uint8 [K/8, N], by input byte: signs[j·N + n] holds
 * inputs 8j..8j+7 of row n (bit i: input 8j + i, 1 for +1; the file's [N, K/8] transposed, which the
 * runtime keeps in memory: zenedge/runtime/variants.py); alpha fp32 [N]; y fp32 [M, N] with row stride ldy, updated in
 * place. K a multiple of 32, at most MAX_INPUTS. Returns 0; -1 when it could not allocate its
 * scratch, -2 for a K it does not take (nothing written then).
 */
#include "x_rows.h"
#include "pool.h"

#define MAX_INPUTS 32768
#define BYTES_AHEAD 8192   /* the signs are streamed into L2 this far ahead */

/* Rows n0..n1-1 of S against every row of x, one (S row, x row) sum at a time: the reference
   steps, and the rows the vector loop's blocks leave over */
static void rows_one_by_one(const uint8_t *signs, int64_t K, int64_t N, const x_rows *x, const float *alpha,
                            float *y, int64_t ldy, int64_t M, int64_t n0, int64_t n1) {
    const int64_t groups = K / 32;
    for (int64_t n = n0; n < n1; n++)
        for (int64_t m = 0; m < M; m++) {
            float a = 0.0f;
            for (int64_t g = 0; g < groups; g++) {
                const int8_t *codes = (const int8_t *)x->codes + m * K + g * 32;
                int32_t plus = 0;
                for (int j = 0; j < 32; j++)
                    plus += (signs[(g * 4 + j / 8) * N + n] >> (j % 8) & 1) * codes[j];
                a = fmaf((float)(2 * plus - x->sum[m * groups + g]), x->step[m * groups + g], a);
            }
            y[m * ldy + n] = fmaf(alpha[n], a, y[m * ldy + n]);
        }
}

/* Lookup tables, built once per row of x: for each group and each quad of 4 inputs 4q..4q+3, the
   16 sums Σ ±x̂ (bit i of the index set: + for input 4q+i), one for each pattern of the quad's 4
   sign bits. A sum lies in ±4·127, so it is stored biased, U = sum + 512 in [4, 1020], in two 5-bit
   halves: U & 31 in one 16-byte table, U >> 5 in another (on AVX2 each is loaded into both 128-bit
   lanes: VPSHUFB looks up within a lane; NEON's TBL has no lanes). A group's 8 lookups add up in
   bytes (each half at most 8·31) and the halves join in 16 bits: Σ U = Σ low + 32·Σ high, minus
   8·512. */
#define BIAS 512

#define QUAD_TABLE 32                  /* bytes per quad: the low table, then the high one */
#define GROUP_TABLES (8 * QUAD_TABLE)  /* bytes per group of 32 inputs */

#if defined(ZENEDGE_AVX2) || defined(ZENEDGE_AVX512)
static void build_tables(x_rows *r, int64_t M, int64_t K) {
    const __m256i bit0 = _mm256_setr_epi16(-1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1),
                  bit1 = _mm256_setr_epi16(-1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1),
                  bit2 = _mm256_setr_epi16(-1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1),
                  bit3 = _mm256_setr_epi16(-1, -1, -1, -1, -1, -1, -1, -1, 1, 1, 1, 1, 1, 1, 1, 1);
    const int8_t *codes = (const int8_t *)r->codes;
    for (int64_t quad = 0; quad < M * K / 4; quad++) {
        const int8_t *c = codes + quad * 4;
        const __m256i sums = _mm256_add_epi16(
            _mm256_add_epi16(_mm256_sign_epi16(_mm256_set1_epi16(c[0]), bit0), _mm256_sign_epi16(_mm256_set1_epi16(c[1]), bit1)),
            _mm256_add_epi16(_mm256_sign_epi16(_mm256_set1_epi16(c[2]), bit2), _mm256_sign_epi16(_mm256_set1_epi16(c[3]), bit3)));
        const __m256i u = _mm256_add_epi16(sums, _mm256_set1_epi16(BIAS));
        const __m256i halves = _mm256_permute4x64_epi64(   /* [16 low halves | 16 high halves] */
            _mm256_packus_epi16(_mm256_and_si256(u, _mm256_set1_epi16(31)), _mm256_srli_epi16(u, 5)), 0xD8);
        _mm256_store_si256((__m256i *)(r->tables + quad * QUAD_TABLE), halves);
    }
}

/* A 16-byte table in both 128-bit lanes (one load) */
INLINE __m256i both_lanes(const uint8_t *table) {
    return _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)table));
}

/* acc[0..3] += d · Σ s·x̂ over one group for S rows 0-31, from their 8 index vectors and tables; acc[j]
   lane i holds row 4i + j (add_block puts the rows back in order) */
INLINE void add_group(const __m256i *idx, const uint8_t *tables, float d, __m256 acc[4]) {
    /* the high halves' byte sums start at -8·BIAS/32 (-128): as signed bytes they are then
       Σ high - 8·BIAS/32, and L + 32·that is Σ U - 8·BIAS, the bias taken off for free */
    _Static_assert(8 * BIAS % 32 == 0 && 8 * BIAS / 32 <= 128, "the bias must fit a signed byte's start");
    __m256i low = _mm256_setzero_si256(), high = _mm256_set1_epi8((char)(-8 * BIAS / 32));
    for (int q = 0; q < 8; q++) {
        low = _mm256_add_epi8(low, _mm256_shuffle_epi8(both_lanes(tables + q * QUAD_TABLE), idx[q]));
        high = _mm256_add_epi8(high, _mm256_shuffle_epi8(both_lanes(tables + q * QUAD_TABLE + 16), idx[q]));
        IN_REGISTERS(low);
        IN_REGISTERS(high);
    }
    /* 16-bit L + 32·H - 8·BIAS for the even rows and for the odd ones, each then widened to 32 bits,
       every second row at a time, by multiply-adds: no shuffles, whose ports the lookups fill
       (the unpacks and sign extensions took about 1.15x the time: BENCHMARKS.md) */
    const __m256i even = _mm256_add_epi16(_mm256_maddubs_epi16(low, _mm256_set1_epi16(1)),
                                          _mm256_maddubs_epi16(_mm256_set1_epi16(32), high));
    const __m256i odd = _mm256_add_epi16(_mm256_maddubs_epi16(low, _mm256_set1_epi16(1 << 8)),
                                         _mm256_maddubs_epi16(_mm256_set1_epi16(32 << 8), high));
    const __m256i first = _mm256_set1_epi32(1), second = _mm256_set1_epi32(1 << 16);
    const __m256i parts[4] = {_mm256_madd_epi16(even, first), _mm256_madd_epi16(odd, first),
                              _mm256_madd_epi16(even, second), _mm256_madd_epi16(odd, second)};
    const __m256 step = _mm256_set1_ps(d);
    for (int i = 0; i < 4; i++)
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(parts[i]), step, acc[i]);
}

#define BLOCK 32                       /* rows of S per vector of indices */
typedef __m256i indices;
typedef __m256 sums;                   /* BLOCK / 4 rows' fp32 sums */

INLINE sums sums_zero(void) { return _mm256_setzero_ps(); }

/* idx[q]: quad q of group g for rows n..n+31, one row per byte */
INLINE void group_indices(const uint8_t *signs, int64_t N, int64_t g, int64_t n, indices idx[8]) {
    for (int b = 0; b < 4; b++) {
        const __m256i bytes = _mm256_loadu_si256((const __m256i *)(signs + (g * 4 + b) * N + n));
        idx[2 * b] = _mm256_and_si256(bytes, _mm256_set1_epi8(0x0F));
        idx[2 * b + 1] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), _mm256_set1_epi8(0x0F));
    }
}

/* y[0..31] = α[0..31]·A + y[0..31] for a block's sums, a[j] lane i holding row 4i + j */
INLINE void add_block(float *y, const float *alpha, const sums *a) {
    const __m256 t0 = _mm256_unpacklo_ps(a[0], a[1]), t1 = _mm256_unpacklo_ps(a[2], a[3]);
    const __m256 t2 = _mm256_unpackhi_ps(a[0], a[1]), t3 = _mm256_unpackhi_ps(a[2], a[3]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t1, 0x44), u1 = _mm256_shuffle_ps(t0, t1, 0xEE);   /* rows 0-3 | 16-19, 4-7 | 20-23 */
    const __m256 u2 = _mm256_shuffle_ps(t2, t3, 0x44), u3 = _mm256_shuffle_ps(t2, t3, 0xEE);   /* rows 8-11 | 24-27, 12-15 | 28-31 */
    const __m256 rows[4] = {_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u2, u3, 0x20),
                            _mm256_permute2f128_ps(u0, u1, 0x31), _mm256_permute2f128_ps(u2, u3, 0x31)};
    for (int q = 0; q < 4; q++)
        _mm256_storeu_ps(y + 8 * q, _mm256_fmadd_ps(_mm256_loadu_ps(alpha + 8 * q), rows[q], _mm256_loadu_ps(y + 8 * q)));
}
#elif defined(ZENEDGE_NEON)
/* The same tables and sums with 128-bit vectors: TBL looks up 16 rows of S at once */
static void build_tables(x_rows *r, int64_t M, int64_t K) {
    static const int16_t sign_of[4][16] = {    /* sign_of[i][j]: + where bit i of j is set */
        {-1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1},
        {-1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1},
        {-1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1},
        {-1, -1, -1, -1, -1, -1, -1, -1, 1, 1, 1, 1, 1, 1, 1, 1}};
    const int8_t *codes = (const int8_t *)r->codes;
    for (int64_t quad = 0; quad < M * K / 4; quad++) {
        const int8_t *c = codes + quad * 4;
        int16x8_t first = vdupq_n_s16(BIAS), second = vdupq_n_s16(BIAS);   /* U of patterns 0-7, 8-15 */
        for (int i = 0; i < 4; i++) {
            first = vmlaq_n_s16(first, vld1q_s16(sign_of[i]), c[i]);
            second = vmlaq_n_s16(second, vld1q_s16(sign_of[i] + 8), c[i]);
        }
        const uint16x8_t a = vreinterpretq_u16_s16(first), b = vreinterpretq_u16_s16(second), five = vdupq_n_u16(31);
        vst1q_u8(r->tables + quad * QUAD_TABLE, vcombine_u8(vmovn_u16(vandq_u16(a, five)), vmovn_u16(vandq_u16(b, five))));
        vst1q_u8(r->tables + quad * QUAD_TABLE + 16, vcombine_u8(vmovn_u16(vshrq_n_u16(a, 5)), vmovn_u16(vshrq_n_u16(b, 5))));
    }
}

/* acc[0..3] (S rows 0-3, 4-7, 8-11, 12-15) += d · Σ s·x̂ over one group */
INLINE void add_group(const uint8x16_t *idx, const uint8_t *tables, float d, float32x4_t acc[4]) {
    uint8x16_t low = vdupq_n_u8(0), high = vdupq_n_u8(0);
    for (int q = 0; q < 8; q++) {
        low = vaddq_u8(low, vqtbl1q_u8(vld1q_u8(tables + q * QUAD_TABLE), idx[q]));
        high = vaddq_u8(high, vqtbl1q_u8(vld1q_u8(tables + q * QUAD_TABLE + 16), idx[q]));
    }
    const uint8x8_t join = vdup_n_u8(32);
    const int16x8_t bias = vdupq_n_s16(8 * BIAS);
    const int16x8_t first = vsubq_s16(vreinterpretq_s16_u16(vmlal_u8(vmovl_u8(vget_low_u8(low)), vget_low_u8(high), join)), bias);
    const int16x8_t second = vsubq_s16(vreinterpretq_s16_u16(vmlal_u8(vmovl_u8(vget_high_u8(low)), vget_high_u8(high), join)), bias);
    const float32x4_t step = vdupq_n_f32(d);
    acc[0] = vfmaq_f32(acc[0], vcvtq_f32_s32(vmovl_s16(vget_low_s16(first))), step);
    acc[1] = vfmaq_f32(acc[1], vcvtq_f32_s32(vmovl_s16(vget_high_s16(first))), step);
    acc[2] = vfmaq_f32(acc[2], vcvtq_f32_s32(vmovl_s16(vget_low_s16(second))), step);
    acc[3] = vfmaq_f32(acc[3], vcvtq_f32_s32(vmovl_s16(vget_high_s16(second))), step);
}

#define BLOCK 16
typedef uint8x16_t indices;
typedef float32x4_t sums;

INLINE sums sums_zero(void) { return vdupq_n_f32(0.0f); }

INLINE void group_indices(const uint8_t *signs, int64_t N, int64_t g, int64_t n, indices idx[8]) {
    for (int b = 0; b < 4; b++) {
        const uint8x16_t bytes = vld1q_u8(signs + (g * 4 + b) * N + n);
        idx[2 * b] = vandq_u8(bytes, vdupq_n_u8(0x0F));
        idx[2 * b + 1] = vshrq_n_u8(bytes, 4);
    }
}

/* y[0..15] = α[0..15]·A + y[0..15] for a block's sums, in order */
INLINE void add_block(float *y, const float *alpha, const sums *a) {
    for (int q = 0; q < 4; q++)
        vst1q_f32(y + 4 * q, vfmaq_f32(vld1q_f32(y + 4 * q), vld1q_f32(alpha + 4 * q), a[q]));
}
#endif

#if defined(ZENEDGE_AVX2) || defined(ZENEDGE_AVX512) || defined(ZENEDGE_NEON)
/* Group by group, and within a group block by block of BLOCK rows: a group's bytes are 4 input-byte
   rows of `width` bytes each (a strip of the ld-wide rows when the columns are split over threads),
   read in order and streamed into L2 some groups ahead (the hardware's prefetchers alone left the
   loads waiting on memory; the strip's own addresses, not the whole rows': a linear guess fetched
   other threads' columns and left each thread waiting), and the group's tables stay in L1 while
   every block uses them. Each (S row, x row) sum still adds its groups in their order. */
INLINE void rows_in_blocks_of(const uint8_t *signs, int64_t K, int64_t N, int64_t ld, const x_rows *x, const float *alpha,
                              float *y, int64_t ldy, const int64_t M) {
    const int64_t groups = K / 32, width = N / BLOCK * BLOCK, lanes = BLOCK / 4;
    const int64_t ahead = BYTES_AHEAD / (4 * N) > 1 ? BYTES_AHEAD / (4 * N) : 1;   /* groups */
    for (int64_t g = 0; g < ahead && g < groups; g++)      /* the first reads, ahead of the loop's own */
        for (int b = 0; b < 4; b++)
            for (int64_t at = 0; at < N; at += 64)
                PREFETCH_L2(signs + (g * 4 + b) * ld + at);
    sums *acc = scratch((size_t)(M * width) * sizeof(float));       /* A [M, width], `lanes` per vector */
    if (!acc) {                            /* no memory for the accumulators: the reference steps */
        rows_one_by_one(signs, K, ld, x, alpha, y, ldy, M, 0, N);
        return;
    }
    for (int64_t i = 0; i < M * width / lanes; i++)
        acc[i] = sums_zero();
    for (int64_t g = 0; g < groups; g++)
        for (int64_t n = 0; n < width; n += BLOCK) {
            if (g + ahead < groups && n % 64 == 0)    /* the same columns, `ahead` groups on */
                for (int b = 0; b < 4; b++)
                    PREFETCH_L2(signs + ((g + ahead) * 4 + b) * ld + n);
            indices idx[8];
            group_indices(signs, ld, g, n, idx);
            for (int64_t m = 0; m < M; m++)
                add_group(idx, x->tables + (m * groups + g) * GROUP_TABLES, x->step[m * groups + g],
                          acc + (m * width + n) / lanes);
        }
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < width; n += BLOCK)
            add_block(y + m * ldy + n, alpha + n, acc + (m * width + n) / lanes);
    free(acc);
    rows_one_by_one(signs, K, ld, x, alpha, y, ldy, M, width, N);
}

/* One row of x (a lone request's decode) gets its own copy of the loop: with M known, the block's
   index vectors stay in registers (about 0.8x the time on an AVX2 core: BENCHMARKS.md) */
static void rows_in_blocks(const uint8_t *signs, int64_t K, int64_t N, int64_t ld, const x_rows *x, const float *alpha,
                           float *y, int64_t ldy, int64_t M) {
    if (M == 1)
        rows_in_blocks_of(signs, K, N, ld, x, alpha, y, ldy, 1);
    else
        rows_in_blocks_of(signs, K, N, ld, x, alpha, y, ldy, M);
}
#else
static void rows_in_blocks(const uint8_t *signs, int64_t K, int64_t N, int64_t ld, const x_rows *x, const float *alpha,
                           float *y, int64_t ldy, int64_t M) {
    rows_one_by_one(signs, K, ld, x, alpha, y, ldy, M, 0, N);
}
#endif

/* x [M, K] (row stride ldx) rounded as this kernel multiplies it, for zenedge_sign_add_rounded: a
   caller adding several sign slices to the same rows rounds them once (decode_step.c). 0; -1 when
   out of memory (free with x_rows_free). */
int zenedge_sign_rows(x_rows *rows, const float *x, int64_t M, int64_t K, int64_t ldx) {
    if (x_rows_make(rows, x, M, K, ldx, 8, NULL))
        return -1;
#if defined(ZENEDGE_AVX2) || defined(ZENEDGE_AVX512) || defined(ZENEDGE_NEON)
    rows->tables = scratch((size_t)(M * K / 32) * GROUP_TABLES);
    if (!rows->tables) {
        x_rows_free(rows);
        return -1;
    }
    build_tables(rows, M, K);
#endif
    return 0;
}

/* One sign slice, for the threads (pool.c) to split by output columns */
typedef struct {
    const x_rows *rows;
    const uint8_t *signs;
    const float *alpha;
    float *y;
    int64_t M, K, N, ldy;
} sign_job;

static void sign_columns(const void *arg, int64_t n0, int64_t n1) {
    const sign_job *j = arg;
    rows_in_blocks(j->signs + n0, j->K, n1 - n0, j->N, j->rows, j->alpha + n0, j->y + n0, j->ldy, j->M);
}

int zenedge_sign_add_rounded(const x_rows *rows, const uint8_t *signs, const float *alpha, float *y, int64_t M,
                             int64_t K, int64_t N, int64_t ldy) {
    if (K % 32 || K > MAX_INPUTS)
        return -2;
    const sign_job job = {rows, signs, alpha, y, M, K, N, ldy};
    zenedge_parallel(sign_columns, &job, N, 64);   /* whole vector blocks of S rows (32 or 16) per range */
    return 0;
}

int zenedge_sign_add(const float *x, const uint8_t *signs, const float *alpha, float *y, int64_t M, int64_t K,
                     int64_t N, int64_t ldx, int64_t ldy) {
    if (K % 32 || K > MAX_INPUTS)
        return -2;
    x_rows rows;
    if (zenedge_sign_rows(&rows, x, M, K, ldx))
        return -1;
    const int status = zenedge_sign_add_rounded(&rows, signs, alpha, y, M, K, N, ldy);
    x_rows_free(&rows);
    return status;
}

/* out[n - n0, k] = w[n, k] + α[n]·S[n, k] for rows n0..n1-1 of a K-input weight (w fp32 [N, K] with
 * row stride ldw, out fp32 [n1 - n0, K] contiguous; signs by input byte as above, [ceil(K/8), N]): the
 * dense W + α⊙S a prefill multiplies with, each weight rounded once, as w + (±α) in fp32. Any K.
 * Returns 0. */
int zenedge_sign_dense(const float *w, const uint8_t *signs, const float *alpha, float *out, int64_t n0,
                       int64_t n1, int64_t K, int64_t N, int64_t ldw) {
    for (int64_t n = n0; n < n1; n++) {
        const float *row = w + n * ldw, a = alpha[n];
        float *dst = out + (n - n0) * K;
        int64_t k = 0;
#if defined(ZENEDGE_AVX2) || defined(ZENEDGE_AVX512)
        const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        const __m256 plus = _mm256_set1_ps(a), minus = _mm256_set1_ps(-a);
        for (; k + 8 <= K; k += 8) {
            const __m256i set = _mm256_and_si256(_mm256_set1_epi32(signs[k / 8 * N + n]), bit);
            const __m256 step = _mm256_blendv_ps(minus, plus, _mm256_castsi256_ps(_mm256_cmpeq_epi32(set, bit)));
            _mm256_storeu_ps(dst + k, _mm256_add_ps(_mm256_loadu_ps(row + k), step));
        }
#endif
        for (; k < K; k++)
            dst[k] = row[k] + (signs[k / 8 * N + n] >> (k % 8) & 1 ? a : -a);
    }
    return 0;
}
