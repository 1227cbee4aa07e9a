/* The C kernels' signatures, for the code that calls one kernel from another (decode_step.c) and
 * for the tests' C driver (tests/kernels/native/parity_driver.c). Each is documented in its file. */
#ifndef ZENEDGE_KERNELS_H
#define ZENEDGE_KERNELS_H
#include <stdint.h>
#include "x_rows.h"
#include "pool.h"

int zenedge_int4_gemm(const float *x, const uint8_t *codes, const uint16_t *scale, const uint16_t *zero,
                      float *y, int64_t M, int64_t N, int64_t K);
int zenedge_int4_gemm_scaled(const float *x, const uint8_t *codes, const void *scale, const void *zero,
                             float *y, int64_t M, int64_t N, int64_t K, int64_t kind);
int zenedge_int4_gemm_x8(const float *x, const uint8_t *codes, const void *scale, const void *zero,
                         float *y, int64_t M, int64_t N, int64_t K, int64_t kind);
int zenedge_int8_gemm(const float *x, const int8_t *codes, const uint16_t *scale, float *y, int64_t M,
                      int64_t N, int64_t K);
int zenedge_rms_norm(const float *x, const float *w, float *y, int64_t M, int64_t K, float eps);
int zenedge_decode_attention(const float *q, const float *keys, const float *values, const int64_t *lengths,
                             float *out, int64_t B, int64_t H, int64_t H_kv, int64_t L, int64_t D,
                             int64_t q_stride, int64_t batch_stride, int64_t head_stride, float scale);
int zenedge_lora_add(const float *x, const float *a, const float *bt, float *y, int64_t M, int64_t K,
                     int64_t N, int64_t r, int64_t ldx, int64_t ldy, float scale);
int zenedge_sign_add(const float *x, const uint8_t *signs, const float *alpha, float *y, int64_t M, int64_t K,
                     int64_t N, int64_t ldx, int64_t ldy);
int zenedge_sign_rows(x_rows *rows, const float *x, int64_t M, int64_t K, int64_t ldx);
int zenedge_sign_add_rounded(const x_rows *rows, const uint8_t *signs, const float *alpha, float *y, int64_t M,
                             int64_t K, int64_t N, int64_t ldy);
int zenedge_sign_dense(const float *w, const uint8_t *signs, const float *alpha, float *out, int64_t n0,
                       int64_t n1, int64_t K, int64_t N, int64_t ldw);
int zenedge_silu_mul(const float *gu, float *out, int64_t M, int64_t I);
#endif
