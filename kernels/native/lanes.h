/* The 16-lane fp32 vector every kernel here is written in, once per instruction set.
 *
 * A `v16` is 16 fp32 lanes whatever the machine's registers are: one AVX-512 register, two AVX2
 * ones, four NEON ones, or an array (the portable scalar build). Every operation works lane by
 * lane with one IEEE rounding (v16_fma: one rounding of a·b + c), and the one operation across
 * lanes, v16_sum, adds in one fixed tree. So a kernel gives the same bits on every instruction set,
 * and the scalar build is the reference the others are tested against (tests/kernels/native).
 *
 * The build defines one of ZENEDGE_AVX512, ZENEDGE_AVX2, ZENEDGE_NEON (kernels/native/__init__.py);
 * none: the scalar reference. Kernels that need more than these (int4_gemv.c's int16 dot products,
 * sign_add.c's table lookups) keep their own small ISA-specific inner loops, whose integer sums are exact.
 */
#ifndef ZENEDGE_LANES_H
#define ZENEDGE_LANES_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(ZENEDGE_AVX512) || defined(ZENEDGE_AVX2)
#include <immintrin.h>
#define PREFETCH_L2(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)
/* A running integer sum kept in a register and added to in order. Left alone, gcc reassociates a
   chain of integer adds into trees of partial sums and spills them to the stack: the int4 product
   took up to 1.25x the time so (BENCHMARKS.md). */
#define IN_REGISTERS(v) __asm__("" : "+v"(v))
#else
#define PREFETCH_L2(p) __builtin_prefetch((p), 0, 2)
#endif
#if defined(ZENEDGE_NEON)
#include <arm_neon.h>
#endif

#define INLINE static inline __attribute__((always_inline))

/* Scratch memory aligned to 64 bytes (aligned_alloc wants a size in whole multiples: macOS refuses others) */
INLINE void *scratch(size_t bytes) {
    return aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
}

INLINE float from_bf16(uint16_t word) {
    const uint32_t bits = (uint32_t)word << 16;
    float value;
    memcpy(&value, &bits, 4);
    return value;
}

#if defined(ZENEDGE_AVX512) /* ------------------------------------------------------------------ */
typedef __m512 v16;
INLINE v16 v16_zero(void) { return _mm512_setzero_ps(); }
INLINE v16 v16_set1(float a) { return _mm512_set1_ps(a); }
INLINE v16 v16_load(const float *p) { return _mm512_loadu_ps(p); }
INLINE void v16_store(float *p, v16 a) { _mm512_storeu_ps(p, a); }
INLINE __mmask16 live_mask(int64_t live) { return live >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << live) - 1); }
INLINE v16 v16_load_part(const float *p, int64_t live) { return _mm512_maskz_loadu_ps(live_mask(live), p); }
INLINE void v16_store_part(float *p, v16 a, int64_t live) { _mm512_mask_storeu_ps(p, live_mask(live), a); }
INLINE v16 v16_first(v16 a, int64_t live) { return _mm512_maskz_mov_ps(live_mask(live), a); }
INLINE v16 v16_add(v16 a, v16 b) { return _mm512_add_ps(a, b); }
INLINE v16 v16_sub(v16 a, v16 b) { return _mm512_sub_ps(a, b); }
INLINE v16 v16_mul(v16 a, v16 b) { return _mm512_mul_ps(a, b); }
INLINE v16 v16_div(v16 a, v16 b) { return _mm512_div_ps(a, b); }
INLINE v16 v16_fma(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); }
INLINE v16 v16_abs(v16 a) { return _mm512_abs_ps(a); }
INLINE v16 v16_where_negative(v16 x, v16 a) { return _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), a); }
INLINE v16 v16_zero_below(v16 a, v16 x, float limit) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(limit), _CMP_NLT_UQ), a); }
INLINE v16 v16_round(v16 a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
INLINE v16 v16_scale_pow2(v16 p, v16 n) { return _mm512_scalef_ps(p, n); }
INLINE v16 v16_from_int8(const int8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }
INLINE v16 v16_from_half(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
INLINE v16 v16_from_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
/* lanes i + i+8, then i + i+4, i + i+2, i + i+1 */
INLINE float v16_sum(v16 a) {
    __m256 t = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    u = _mm_add_ps(u, _mm_shuffle_ps(u, u, _MM_SHUFFLE(1, 0, 3, 2)));
    u = _mm_add_ps(u, _mm_shuffle_ps(u, u, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtss_f32(u);
}

#elif defined(ZENEDGE_AVX2) /* ------------------------------------------------------------------- */
typedef struct { __m256 lo, hi; } v16;   /* lanes 0-7, 8-15 */
#define BOTH(op, a, b) ((v16){op((a).lo, (b).lo), op((a).hi, (b).hi)})
INLINE v16 v16_zero(void) { return (v16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
INLINE v16 v16_set1(float a) { return (v16){_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
INLINE v16 v16_load(const float *p) { return (v16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
INLINE void v16_store(float *p, v16 a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
INLINE v16 v16_add(v16 a, v16 b) { return BOTH(_mm256_add_ps, a, b); }
INLINE v16 v16_sub(v16 a, v16 b) { return BOTH(_mm256_sub_ps, a, b); }
INLINE v16 v16_mul(v16 a, v16 b) { return BOTH(_mm256_mul_ps, a, b); }
INLINE v16 v16_div(v16 a, v16 b) { return BOTH(_mm256_div_ps, a, b); }
INLINE v16 v16_fma(v16 a, v16 b, v16 c) { return (v16){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
INLINE v16 v16_abs(v16 a) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    return (v16){_mm256_and_ps(a.lo, magnitude), _mm256_and_ps(a.hi, magnitude)};
}
INLINE v16 v16_where_negative(v16 x, v16 a) {
    const __m256 zero = _mm256_setzero_ps();
    return (v16){_mm256_blendv_ps(x.lo, a.lo, _mm256_cmp_ps(x.lo, zero, _CMP_LT_OQ)),
                 _mm256_blendv_ps(x.hi, a.hi, _mm256_cmp_ps(x.hi, zero, _CMP_LT_OQ))};
}
INLINE v16 v16_zero_below(v16 a, v16 x, float limit) {
    const __m256 l = _mm256_set1_ps(limit);
    return (v16){_mm256_and_ps(a.lo, _mm256_cmp_ps(x.lo, l, _CMP_NLT_UQ)), _mm256_and_ps(a.hi, _mm256_cmp_ps(x.hi, l, _CMP_NLT_UQ))};
}
INLINE v16 v16_round(v16 a) {
    return (v16){_mm256_round_ps(a.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                 _mm256_round_ps(a.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
/* p·2^n for whole n in -126..127 (the exponent field built directly) */
INLINE __m256 scale_pow2_8(__m256 p, __m256 n) {
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
INLINE v16 v16_scale_pow2(v16 p, v16 n) { return (v16){scale_pow2_8(p.lo, n.lo), scale_pow2_8(p.hi, n.hi)}; }
INLINE v16 v16_from_int8(const int8_t *p) {   /* two 8-byte loads: each widening reads memory itself */
    return (v16){_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))),
                 _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8))))};
}
INLINE v16 v16_from_half(const uint16_t *p) {
    return (v16){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)))};
}
INLINE __m256 widen_bf16_8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
INLINE v16 v16_from_bf16(const uint16_t *p) { return (v16){widen_bf16_8(p), widen_bf16_8(p + 8)}; }
INLINE float v16_sum(v16 a) {
    __m256 t = _mm256_add_ps(a.lo, a.hi);
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    u = _mm_add_ps(u, _mm_shuffle_ps(u, u, _MM_SHUFFLE(1, 0, 3, 2)));
    u = _mm_add_ps(u, _mm_shuffle_ps(u, u, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtss_f32(u);
}

#elif defined(ZENEDGE_NEON) /* ------------------------------------------------------------------- */
typedef struct { float32x4_t q[4]; } v16;   /* lanes 0-3, 4-7, 8-11, 12-15 */
INLINE v16 v16_zero(void) { const float32x4_t z = vdupq_n_f32(0.0f); return (v16){{z, z, z, z}}; }
INLINE v16 v16_set1(float a) { const float32x4_t v = vdupq_n_f32(a); return (v16){{v, v, v, v}}; }
INLINE v16 v16_load(const float *p) { return (v16){{vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}}; }
INLINE void v16_store(float *p, v16 a) { for (int i = 0; i < 4; i++) vst1q_f32(p + 4 * i, a.q[i]); }
#define NEON_EACH2(name, op) \
    INLINE v16 name(v16 a, v16 b) { v16 r; for (int i = 0; i < 4; i++) r.q[i] = op(a.q[i], b.q[i]); return r; }
NEON_EACH2(v16_add, vaddq_f32)
NEON_EACH2(v16_sub, vsubq_f32)
NEON_EACH2(v16_mul, vmulq_f32)
NEON_EACH2(v16_div, vdivq_f32)
INLINE v16 v16_fma(v16 a, v16 b, v16 c) { v16 r; for (int i = 0; i < 4; i++) r.q[i] = vfmaq_f32(c.q[i], a.q[i], b.q[i]); return r; }
INLINE v16 v16_abs(v16 a) { v16 r; for (int i = 0; i < 4; i++) r.q[i] = vabsq_f32(a.q[i]); return r; }
INLINE v16 v16_where_negative(v16 x, v16 a) {
    v16 r;
    for (int i = 0; i < 4; i++)
        r.q[i] = vbslq_f32(vcltzq_f32(x.q[i]), a.q[i], x.q[i]);
    return r;
}
INLINE v16 v16_zero_below(v16 a, v16 x, float limit) {   /* NaN lanes of x keep a, as NLT does */
    v16 r;
    for (int i = 0; i < 4; i++)
        r.q[i] = vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(a.q[i]), vcltq_f32(x.q[i], vdupq_n_f32(limit))));
    return r;
}
INLINE v16 v16_round(v16 a) { v16 r; for (int i = 0; i < 4; i++) r.q[i] = vrndnq_f32(a.q[i]); return r; }
INLINE v16 v16_scale_pow2(v16 p, v16 n) {   /* whole n in -126..127 */
    v16 r;
    for (int i = 0; i < 4; i++) {
        const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n.q[i]), vdupq_n_s32(127)), 23);
        r.q[i] = vmulq_f32(p.q[i], vreinterpretq_f32_s32(e));
    }
    return r;
}
INLINE v16 v16_from_int8(const int8_t *p) {
    const int8x16_t b = vld1q_s8(p);
    const int16x8_t lo = vmovl_s8(vget_low_s8(b)), hi = vmovl_high_s8(b);
    return (v16){{vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), vcvtq_f32_s32(vmovl_high_s16(lo)),
                  vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), vcvtq_f32_s32(vmovl_high_s16(hi))}};
}
INLINE v16 v16_from_half(const uint16_t *p) {
    v16 r;
    for (int i = 0; i < 4; i++)
        r.q[i] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * i)));
    return r;
}
INLINE v16 v16_from_bf16(const uint16_t *p) {
    v16 r;
    for (int i = 0; i < 4; i++)
        r.q[i] = vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p + 4 * i), 16));
    return r;
}
INLINE float v16_sum(v16 a) {
    const float32x4_t u = vaddq_f32(vaddq_f32(a.q[0], a.q[2]), vaddq_f32(a.q[1], a.q[3]));
    const float32x4_t w = vaddq_f32(u, vextq_f32(u, u, 2));
    return vgetq_lane_f32(w, 0) + vgetq_lane_f32(w, 1);
}

#else /* the scalar reference ---------------------------------------------------------------------- */
typedef struct { float f[16]; } v16;
#define LANES(expr) do { for (int l = 0; l < 16; l++) { expr; } } while (0)
INLINE v16 v16_zero(void) { v16 r; LANES(r.f[l] = 0.0f); return r; }
INLINE v16 v16_set1(float a) { v16 r; LANES(r.f[l] = a); return r; }
INLINE v16 v16_load(const float *p) { v16 r; memcpy(r.f, p, sizeof r.f); return r; }
INLINE void v16_store(float *p, v16 a) { memcpy(p, a.f, sizeof a.f); }
INLINE v16 v16_add(v16 a, v16 b) { v16 r; LANES(r.f[l] = a.f[l] + b.f[l]); return r; }
INLINE v16 v16_sub(v16 a, v16 b) { v16 r; LANES(r.f[l] = a.f[l] - b.f[l]); return r; }
INLINE v16 v16_mul(v16 a, v16 b) { v16 r; LANES(r.f[l] = a.f[l] * b.f[l]); return r; }
INLINE v16 v16_div(v16 a, v16 b) { v16 r; LANES(r.f[l] = a.f[l] / b.f[l]); return r; }
INLINE v16 v16_fma(v16 a, v16 b, v16 c) { v16 r; LANES(r.f[l] = fmaf(a.f[l], b.f[l], c.f[l])); return r; }
INLINE v16 v16_abs(v16 a) { v16 r; LANES(r.f[l] = fabsf(a.f[l])); return r; }
INLINE v16 v16_where_negative(v16 x, v16 a) { v16 r; LANES(r.f[l] = x.f[l] < 0.0f ? a.f[l] : x.f[l]); return r; }
INLINE v16 v16_zero_below(v16 a, v16 x, float limit) { v16 r; LANES(r.f[l] = x.f[l] < limit ? 0.0f : a.f[l]); return r; }
INLINE v16 v16_round(v16 a) { v16 r; LANES(r.f[l] = nearbyintf(a.f[l])); return r; }   /* the default mode: to nearest even */
INLINE v16 v16_scale_pow2(v16 p, v16 n) {
    v16 r;
    LANES(r.f[l] = isnan(n.f[l]) ? n.f[l] : ldexpf(p.f[l], (int)fmaxf(fminf(n.f[l], 300.0f), -300.0f)));
    return r;
}
INLINE v16 v16_from_int8(const int8_t *p) { v16 r; LANES(r.f[l] = (float)p[l]); return r; }
INLINE float from_half(uint16_t h) {   /* fp16 → fp32, exactly */
    const float magnitude = (h & 0x7C00u) == 0x7C00u ? ((h & 0x3FFu) ? NAN : INFINITY)
                          : (h & 0x7C00u) ? ldexpf((float)(0x400u | (h & 0x3FFu)), (int)((h >> 10) & 0x1Fu) - 25)
                          : ldexpf((float)(h & 0x3FFu), -24);
    return (h & 0x8000u) ? -magnitude : magnitude;
}
INLINE v16 v16_from_half(const uint16_t *p) { v16 r; LANES(r.f[l] = from_half(p[l])); return r; }
INLINE v16 v16_from_bf16(const uint16_t *p) { v16 r; LANES(r.f[l] = from_bf16(p[l])); return r; }
INLINE float v16_sum(v16 a) {
    float t[8], u[4];
    for (int l = 0; l < 8; l++)
        t[l] = a.f[l] + a.f[l + 8];
    for (int l = 0; l < 4; l++)
        u[l] = t[l] + t[l + 4];
    return (u[0] + u[2]) + (u[1] + u[3]);
}
#endif

#if !defined(ZENEDGE_AVX512) /* partial vectors through a zeroed copy (tails only) */
INLINE v16 v16_load_part(const float *p, int64_t live) {
    if (live >= 16)
        return v16_load(p);
    float part[16] = {0};
    memcpy(part, p, (size_t)live * sizeof(float));
    return v16_load(part);
}
INLINE void v16_store_part(float *p, v16 a, int64_t live) {
    if (live >= 16) {
        v16_store(p, a);
        return;
    }
    float part[16];
    v16_store(part, a);
    memcpy(p, part, (size_t)live * sizeof(float));
}
INLINE v16 v16_first(v16 a, int64_t live) {
    if (live >= 16)
        return a;
    float part[16];
    v16_store(part, a);
    memset(part + live, 0, (size_t)(16 - live) * sizeof(float));
    return v16_load(part);
}
#endif

/* e^x for x ≤ 0 (softmax arguments, SiLU's e^-|x|): 2^n · p(r) with x = n·ln2 + r, |r| ≤ ln2/2, p a
   degree-6 Taylor polynomial (truncation ~1.2e-7 relative at |r| = ln2/2); below -87 it is 0. */
INLINE v16 v16_exp_nonpositive(v16 x) {
    const v16 n = v16_round(v16_mul(x, v16_set1(1.44269504f)));
    /* r = x - n·ln2 in two fused steps (ln2 split in a high part exact in n·ln2_hi and a low one) */
    const v16 r = v16_fma(n, v16_set1(2.12194440e-4f), v16_fma(n, v16_set1(-0.693359375f), x));
    v16 p = v16_set1(1.0f / 720);
    p = v16_fma(p, r, v16_set1(1.0f / 120));
    p = v16_fma(p, r, v16_set1(1.0f / 24));
    p = v16_fma(p, r, v16_set1(1.0f / 6));
    p = v16_fma(p, r, v16_set1(0.5f));
    p = v16_fma(p, r, v16_set1(1.0f));
    p = v16_fma(p, r, v16_set1(1.0f));
    return v16_zero_below(v16_scale_pow2(p, n), x, -87.0f);
}
#endif
