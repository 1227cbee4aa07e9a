/* A whole lean decode step of a Llama-family model's layers in one call, fp32, on the CPU.
 *
 * Once the matmuls stream at memory speed, what is left of a step is glue: per layer some fifty
 * small torch ops and Python calls between the kernels (RMSNorm, the stacked q/k/v product, rope,
 * the KV writes, attention, o, the residual adds, gate/up, SiLU·up, down), a large share of a small
 * model's step (BENCHMARKS.md). Here the same steps run back to back in C, calling the same kernels
 * (rms_norm.c, int4_gemv.c, lora_add.c, sign_add.c, decode_attention.c) with the same arguments, and doing the
 * glue with the same roundings as the torch ops it replaces:
 *   - rope: x·cos + roll(x, D/2)·sin with sin's first half negated, a multiply, a multiply, an add
 *     (no FMA: torch rounds each op); q and k in place in the q/k/v product;
 *   - k and v copied to each row's next column of the layer's cache;
 *   - residual adds x + y; SiLU(gate)·up through zenedge_silu_mul, which the Python path calls too.
 * So a step gives bit for bit what lean_llama's Python step gives (a test says so), and a row's
 * numbers do not depend on the rows beside it: every kernel called sums each row alone.
 *
 * The products, their sign slices and the attention split their outputs over the caller's threads
 * (pool.c: zenedge_set_threads), each output summed by one thread as on one: the thread count
 * changes no bit either. The glue (norms, rope, the cache writes, SiLU·up, LoRA slices) is small
 * and stays on the calling thread.
 *
 * The rows may serve different variants (a mixed batch): each product streams the base's int4
 * weights once for all n rows, then adds every variant's LoRA or 1-bit sign slices on the rows
 * that use it. No variant needs a weight copy of its own.
 *
 * x [n, hidden] fp32 is updated in place (the residual stream after the last layer). Per layer: a
 * zenedge_layer (its norms, four int4 products with their variants' deltas, this step's
 * views of its key and value cache: element (b, j, l, d) at b·strides[0] + j·strides[1] +
 * l·strides[2] + d). cos, sin [n, D]; positions [n] (the column each row writes), lengths [n]
 * (positions + 1), length: the views' L. Returns 0; -1 when a scratch buffer could not be had; the
 * first non-zero status of a kernel it calls.
 */
#include "kernels.h"
#include "lanes.h"
#include "pool.h"
#include <stdatomic.h>

#define MAX_SLICES 3   /* LoRA or sign slices a variant adds to one product (q, k, v) */

typedef struct {                 /* y[:, offset:offset + width] += scale·(x·Aᵀ)·Bᵀ */
    const float *a, *bt;         /* A [rank, inputs], Bᵀ [rank, width], contiguous */
    int64_t rank, offset, width;
    float scale;
} zenedge_lora;

typedef struct {                 /* y[:, offset:offset + width] += α ⊙ (S·x) (sign_add.c) */
    const uint8_t *signs;        /* [inputs/8, width], by input byte, LSB first (sign_add.c) */
    const float *alpha;          /* [width] */
    int64_t offset, width;
} zenedge_signs;

typedef struct {                 /* what one variant adds to a product, on the rows that use it */
    const int64_t *rows;         /* those rows of the step, ascending; NULL: every row */
    int64_t count, loras, signs;
    zenedge_lora lora[MAX_SLICES];
    zenedge_signs sign[MAX_SLICES];
} zenedge_delta;

typedef struct {                 /* y = x·Wᵀ (int4_gemv.c's layout) plus each row's variant */
    const uint8_t *codes;
    const void *scale, *zero;
    int64_t kind;                /* int4_gemv.c's SCALES_* */
    int64_t rows, inputs, deltas;
    const zenedge_delta *delta;  /* [deltas] */
} zenedge_product;

typedef struct {
    const float *norm1, *norm2;  /* RMSNorm weights [hidden] */
    float eps1, eps2;
    zenedge_product qkv, o, gate_up, down;
    float *keys, *values;
    int64_t strides[3];
} zenedge_layer;

typedef struct {
    int64_t hidden, heads, kv_heads, dim, intermediate;
    float attention_scale;
} zenedge_shape;

/* out[m, j] = SiLU(gu[m, j])·gu[m, I + j] for rows of gate and up side by side, SiLU(g) =
   g / (1 + e^-g), as g·t / (1 + t) with t = e^g below 0 (no overflow). */
int zenedge_silu_mul(const float *gu, float *out, int64_t M, int64_t I) {
    const v16 one = v16_set1(1.0f);
    for (int64_t m = 0; m < M; m++) {
        const float *g = gu + m * 2 * I, *u = g + I;
        for (int64_t j = 0; j < I; j += 16) {
            const v16 x = v16_load_part(g + j, I - j);
            const v16 t = v16_exp_nonpositive(v16_sub(v16_zero(), v16_abs(x)));   /* e^-|x| */
            const v16 top = v16_where_negative(x, v16_mul(x, t));                 /* x or x·t */
            const v16 silu = v16_div(top, v16_add(one, t));
            v16_store_part(out + m * I + j, v16_mul(silu, v16_load_part(u + j, I - j)), I - j);
        }
    }
    return 0;
}

/* Gathered rows for a variant that only some rows of the step use: their x and y, contiguous */
typedef struct {
    float *x, *y;
} gathered;

/* The variant's slices on m rows: x [m, inputs], y [m, rows] */
static int add_delta(const zenedge_delta *d, const float *x, float *y, int64_t m, int64_t inputs, int64_t rows) {
    int status = 0;
    for (int64_t i = 0; i < d->loras && !status; i++) {
        const zenedge_lora *l = &d->lora[i];
        status = zenedge_lora_add(x, l->a, l->bt, y + l->offset, m, inputs, l->width, l->rank, inputs, rows, l->scale);
    }
    if (!d->signs || status)
        return status;
    x_rows rounded;                 /* x rounded once for all of the variant's sign slices */
    if (zenedge_sign_rows(&rounded, x, m, inputs, inputs))
        return -1;
    for (int64_t i = 0; i < d->signs && !status; i++) {
        const zenedge_signs *s = &d->sign[i];
        status = zenedge_sign_add_rounded(&rounded, s->signs, s->alpha, y + s->offset, m, inputs, s->width, rows);
    }
    x_rows_free(&rounded);
    return status;
}

/* One pass of the int4 kernel over the base's weights for all n rows, then each variant's slices
   on its own rows (gathered where it has some of them only: the kernels sum each row alone, so a
   row's numbers are the same gathered or not). */
static int product(const zenedge_product *p, const float *x, float *y, int64_t n, gathered g) {
    int status = zenedge_int4_gemm_scaled(x, p->codes, p->scale, p->zero, y, n, p->rows, p->inputs, p->kind);
    for (int64_t i = 0; i < p->deltas && !status; i++) {
        const zenedge_delta *d = &p->delta[i];
        if (!d->rows) {
            status = add_delta(d, x, y, n, p->inputs, p->rows);
            continue;
        }
        const size_t x_row = (size_t)p->inputs * sizeof(float), y_row = (size_t)p->rows * sizeof(float);
        for (int64_t j = 0; j < d->count; j++) {
            memcpy(g.x + j * p->inputs, x + d->rows[j] * p->inputs, x_row);
            memcpy(g.y + j * p->rows, y + d->rows[j] * p->rows, y_row);
        }
        status = add_delta(d, g.x, g.y, d->count, p->inputs, p->rows);
        for (int64_t j = 0; j < d->count; j++)
            memcpy(y + d->rows[j] * p->rows, g.y + j * p->rows, y_row);
    }
    return status;
}

/* x·cos + roll(x, D/2)·sin over `heads` heads of D in each of n rows (row stride `ld`), in place */
static void rope(float *x, int64_t n, int64_t heads, int64_t D, int64_t ld, const float *cos, const float *sin) {
    float rolled[256];
    for (int64_t b = 0; b < n; b++)
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + b * ld + h * D;
            memcpy(rolled, v + D / 2, (size_t)(D / 2) * sizeof(float));
            memcpy(rolled + D / 2, v, (size_t)(D / 2) * sizeof(float));
            for (int64_t d = 0; d < D; d += 16) {
                const v16 c = v16_load(cos + b * D + d), s = v16_load(sin + b * D + d);
                v16_store(v + d, v16_add(v16_mul(v16_load(v + d), c), v16_mul(v16_load(rolled + d), s)));
            }
        }
}

/* The step's attention, for the threads (pool.c) to split by (row, KV head): each pair's queries
   alone, as the kernel computes them in a whole call */
typedef struct {
    const float *qkv, *keys, *values;
    const int64_t *lengths;
    float *out;
    int64_t H, H_kv, L, D, q_stride, batch_stride, head_stride;
    float scale;
    _Atomic int status;              /* the first failure, or 0 */
} attention_job;

static void attention_heads(const void *arg, int64_t begin, int64_t end) {
    attention_job *a = (attention_job *)arg;
    const int64_t G = a->H / a->H_kv;
    for (int64_t i = begin; i < end; i++) {
        const int64_t b = i / a->H_kv, j = i % a->H_kv;
        const int status = zenedge_decode_attention(
            a->qkv + b * a->q_stride + j * G * a->D, a->keys + b * a->batch_stride + j * a->head_stride,
            a->values + b * a->batch_stride + j * a->head_stride, a->lengths + b, a->out + (b * a->H + j * G) * a->D, 1,
            G, 1, a->L, a->D, a->q_stride, a->batch_stride, a->head_stride, a->scale);
        if (status)
            a->status = status;
    }
}

static void add_into(float *x, const float *y, int64_t count) {
    for (int64_t i = 0; i < count; i += 16)
        v16_store_part(x + i, v16_add(v16_load_part(x + i, count - i), v16_load_part(y + i, count - i)), count - i);
}

int zenedge_decode_step(float *x, int64_t n, const zenedge_layer *layers, int64_t count, const zenedge_shape *shape,
                        const float *cos, const float *sin, const int64_t *positions, const int64_t *lengths,
                        int64_t length) {
    const int64_t hidden = shape->hidden, H = shape->heads, H_kv = shape->kv_heads, D = shape->dim,
                  I = shape->intermediate, qkv_width = (H + 2 * H_kv) * D;
    if (D % 16 || D > 256)
        return -2;
    const int64_t widest_in = hidden > I ? (hidden > H * D ? hidden : H * D) : (I > H * D ? I : H * D),
                  widest_out = qkv_width > 2 * I ? qkv_width : (2 * I > hidden ? 2 * I : hidden);
    const int64_t sizes[8] = {n * hidden, n * qkv_width, n * H * D, n * hidden, n * 2 * I, n * I,
                              n * widest_in, n * widest_out};
    int64_t total = 0;
    for (int i = 0; i < 8; i++)
        total += sizes[i];
    float *scratch = malloc((size_t)total * sizeof(float));
    if (!scratch)
        return -1;
    float *h = scratch, *qkv = h + sizes[0], *att = qkv + sizes[1], *y = att + sizes[2], *gu = y + sizes[3],
          *m = gu + sizes[4];
    const gathered g = {m + sizes[5], m + sizes[5] + sizes[6]};
    int status = 0;
    for (int64_t i = 0; i < count && !status; i++) {
        const zenedge_layer *L = &layers[i];
        zenedge_rms_norm(x, L->norm1, h, n, hidden, L->eps1);
        if ((status = product(&L->qkv, h, qkv, n, g)))
            break;
        rope(qkv, n, H + H_kv, D, qkv_width, cos, sin);
        for (int64_t b = 0; b < n; b++)
            for (int64_t j = 0; j < H_kv; j++) {
                const int64_t at = b * L->strides[0] + j * L->strides[1] + positions[b] * L->strides[2];
                memcpy(L->keys + at, qkv + b * qkv_width + (H + j) * D, (size_t)D * sizeof(float));
                memcpy(L->values + at, qkv + b * qkv_width + (H + H_kv + j) * D, (size_t)D * sizeof(float));
            }
        attention_job heads = {qkv, L->keys, L->values, lengths, att, H, H_kv, length, D, qkv_width,
                                     L->strides[0], L->strides[1], shape->attention_scale, 0};
        zenedge_parallel(attention_heads, &heads, n * H_kv, 1);
        if ((status = heads.status))
            break;
        if ((status = product(&L->o, att, y, n, g)))
            break;
        add_into(x, y, n * hidden);
        zenedge_rms_norm(x, L->norm2, h, n, hidden, L->eps2);
        if ((status = product(&L->gate_up, h, gu, n, g)))
            break;
        zenedge_silu_mul(gu, m, n, I);
        if ((status = product(&L->down, m, y, n, g)))
            break;
        add_into(x, y, n * hidden);
    }
    free(scratch);
    return status;
}
