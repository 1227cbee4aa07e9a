/* Runs every C kernel on fixed pseudo-random inputs and prints each output's bits, one line per
 * kernel, so that builds for different instruction sets can be compared byte for byte: the host's
 * scalar reference against an ARM64 NEON build run under qemu-user (test_neon.py). The inputs are
 * made here, not read, so the same binary needs nothing but itself under emulation.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "lanes.h"

static uint64_t state = 0x9E3779B97F4A7C15u;

static uint32_t next(void) {   /* xorshift64* */
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return (uint32_t)((state * 0x2545F4914F6CDD1Du) >> 32);
}

static float uniform(float spread) {   /* in (-spread, spread) */
    return ((float)(next() >> 8) / 16777216.0f * 2.0f - 1.0f) * spread;
}

static float *floats(int64_t count, float spread) {
    float *p = malloc((size_t)count * sizeof(float));
    for (int64_t i = 0; i < count; i++)
        p[i] = uniform(spread);
    return p;
}

static uint16_t to_bf16(float value) {   /* rounding to nearest even: the inputs here are finite */
    uint32_t bits;
    memcpy(&bits, &value, 4);
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

static void *bytes(int64_t count) {
    uint8_t *p = malloc((size_t)count);
    for (int64_t i = 0; i < count; i++)
        p[i] = (uint8_t)next();
    return p;
}

static uint16_t *bf16s(int64_t count, float spread) {
    uint16_t *p = malloc((size_t)count * sizeof(uint16_t));
    for (int64_t i = 0; i < count; i++)
        p[i] = to_bf16(uniform(spread));
    return p;
}

static uint16_t *halves(int64_t count) {   /* fp16 in ±[2^-7, 2^-1) */
    uint16_t *p = malloc((size_t)count * sizeof(uint16_t));
    for (int64_t i = 0; i < count; i++)
        p[i] = (uint16_t)((next() & 0x8000u) | ((8u + next() % 6u) << 10) | (next() & 0x3FFu));
    return p;
}

static void print(const char *name, const float *y, int64_t count) {
    printf("%s", name);
    for (int64_t i = 0; i < count; i++) {
        uint32_t bits;
        memcpy(&bits, &y[i], 4);
        printf(" %08x", bits);
    }
    printf("\n");
}

int main(void) {
    char name[32];
    {   /* int4: 3 blocks of 16 rows, 6 groups; x rows that take every tile size */
        const int64_t N = 48, K = 192;
        uint8_t *codes = bytes(N * K / 2);
        uint16_t *scale = bf16s(N * K / 32, 0.1f), *zero = bf16s(N * K / 32, 0.1f);
        for (int64_t M = 1; M <= 13; M += 4) {
            float *x = floats(M * K, 3.0f), *y = malloc((size_t)(M * N) * sizeof(float));
            if (zenedge_int4_gemm(x, codes, scale, zero, y, M, N, K))
                return 1;
            snprintf(name, sizeof name, "int4-%d", (int)M);
            print(name, y, M * N);
            if (zenedge_int4_gemm_x8(x, codes, scale, zero, y, M, N, K, 0))   /* x rounded to int8 */
                return 1;
            snprintf(name, sizeof name, "int4x8-%d", (int)M);
            print(name, y, M * N);
            free(x);
            free(y);
        }
    }
    {   /* int8: a partial last block (B = 3 blocks for 37 rows) */
        const int64_t N = 37, K = 96, B = 3;
        int8_t *codes = bytes(B * 16 * K);
        uint16_t *scale = halves(B * 16 * K / 32);
        for (int64_t M = 1; M <= 9; M += 4) {
            float *x = floats(M * K, 1.0f), *y = malloc((size_t)(M * N) * sizeof(float));
            if (zenedge_int8_gemm(x, codes, scale, y, M, N, K))
                return 1;
            snprintf(name, sizeof name, "int8-%d", (int)M);
            print(name, y, M * N);
        }
    }
    {
        float *x = floats(3 * 100, 2.0f), *w = floats(100, 1.0f), y[300];
        zenedge_rms_norm(x, w, y, 3, 100, 1e-5f);
        print("rms_norm", y, 300);
    }
    {   /* 2 rows, 6 query heads over 2 KV heads of 32, a cache of 40 positions, lengths 21 and 37 */
        float *q = floats(2 * 6 * 32, 1.0f), *keys = floats(2 * 2 * 40 * 32, 2.0f), *values = floats(2 * 2 * 40 * 32, 2.0f);
        int64_t lengths[2] = {21, 37};
        float out[2 * 6 * 32];
        if (zenedge_decode_attention(q, keys, values, lengths, out, 2, 6, 2, 37, 32, 6 * 32, 2 * 40 * 32, 40 * 32, 0.3f))
            return 1;
        print("attention", out, 2 * 6 * 32);
    }
    {
        float *x = floats(3 * 40, 1.0f), *a = floats(5 * 40, 1.0f), *bt = floats(5 * 37, 1.0f), *y = floats(3 * 37, 1.0f);
        if (zenedge_lora_add(x, a, bt, y, 3, 40, 37, 5, 40, 37, 0.5f))
            return 1;
        print("lora", y, 3 * 37);
    }
    {
        uint8_t *signs = bytes(37 * 13);   /* [13, 37]: 96 inputs for the sign product, 100 for the dense rows */
        float *alpha = floats(37, 0.01f);
        for (int64_t M = 1; M <= 5; M += 2) {
            float *x = floats(M * 96, 1.0f), *y = floats(M * 37, 1.0f);
            if (zenedge_sign_add(x, signs, alpha, y, M, 96, 37, 96, 37))
                return 1;
            snprintf(name, sizeof name, "signs-%d", (int)M);
            print(name, y, M * 37);
        }
        float *w = floats(37 * 100, 0.1f), *dense = floats(30 * 100, 1.0f);   /* 100 inputs: a partial byte */
        zenedge_sign_dense(w, signs, alpha, dense, 7, 37, 100, 37, 100);
        print("sign_dense", dense, 30 * 100);
    }
    {
        float *gu = floats(3 * 80, 6.0f), out[3 * 40];
        gu[0] = -100.0f;   /* e^x's cut-off, and both zeros */
        gu[1] = -87.5f;
        gu[2] = 0.0f;
        gu[3] = -0.0f;
        zenedge_silu_mul(gu, out, 3, 40);
        print("silu_mul", out, 3 * 40);
    }
    return 0;
}
