"""A/B of the int4 and sign products (int4_gemv.c, sign_add.c): the sources at a git commit against
the working tree, AVX2 builds linked into one C driver (no Python between calls), rounds
interleaved, best of 25. A pass is 8 layers' int4 weights of the default base's shapes (18 MB),
or 90 layers' distinct 1-bit signs of its shapes (40 MB, more than this machine's L3, so they
stream from memory as in a decode step), called as the decode step calls them (x rounded once per
product, then each slice), reported per 30 layers. The driver first checks that both builds give
the same bits. Run from the repository root:
python -m tools.ab_c_kernels [COMMIT] (default HEAD)."""
import subprocess
import sys
import tempfile
from pathlib import Path

from zenedge.kernels import native

DRIVER = r"""
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <time.h>
#include "x_rows.h"
int old_int4(const float *, const uint8_t *, const uint16_t *, const uint16_t *, float *, int64_t, int64_t, int64_t);
int new_int4(const float *, const uint8_t *, const uint16_t *, const uint16_t *, float *, int64_t, int64_t, int64_t);
int old_rows(x_rows *, const float *, int64_t, int64_t, int64_t);
int new_rows(x_rows *, const float *, int64_t, int64_t, int64_t);
int old_add(const x_rows *, const uint8_t *, const float *, float *, int64_t, int64_t, int64_t, int64_t);
int new_add(const x_rows *, const uint8_t *, const float *, float *, int64_t, int64_t, int64_t, int64_t);
typedef int (*int4_fn)(const float *, const uint8_t *, const uint16_t *, const uint16_t *, float *, int64_t, int64_t, int64_t);
typedef int (*rows_fn)(x_rows *, const float *, int64_t, int64_t, int64_t);
typedef int (*add_fn)(const x_rows *, const uint8_t *, const float *, float *, int64_t, int64_t, int64_t, int64_t);
static const int4_fn INT4[2] = {old_int4, new_int4};
static const rows_fn ROWS[2] = {old_rows, new_rows};
static const add_fn ADD[2] = {old_add, new_add};
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static const int64_t W4[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};       /* qkv, o, gate_up, down */
static const int64_t S1[7][2] = {{576, 576}, {192, 576}, {192, 576}, {576, 576}, {1536, 576}, {1536, 576}, {576, 1536}};
static const int PRODUCT[4][3] = {{0, 1, 2}, {3, -1, -1}, {4, 5, -1}, {6, -1, -1}};   /* sign slices per product */
static uint8_t *codes[8][4], *signs[90][7];
static uint16_t *scale[8][4], *zero[8][4];
static float *alpha[90][7], *x, *y;
static void int4_pass(int v, int M) {
    for (int l = 0; l < 8; l++)
        for (int p = 0; p < 4; p++)
            INT4[v](x, codes[l][p], scale[l][p], zero[l][p], y, M, W4[p][0], W4[p][1]);
}
static void sign_pass(int v, int M) {
    for (int l = 0; l < 90; l++)
        for (int p = 0; p < 4; p++) {
            const int64_t K = p == 3 ? 1536 : 576;
            x_rows rows;
            ROWS[v](&rows, x, M, K, K);
            for (int s = 0; s < 3 && PRODUCT[p][s] >= 0; s++) {
                const int i = PRODUCT[p][s];
                ADD[v](&rows, signs[l][i], alpha[l][i], y, M, K, S1[i][0], S1[i][0]);
            }
            x_rows_free(&rows);
        }
}
int main(void) {
    srand(1);
    for (int l = 0; l < 8; l++)
        for (int p = 0; p < 4; p++) {
            const int64_t n = W4[p][0], k = W4[p][1];
            codes[l][p] = malloc(n * k / 2);
            scale[l][p] = malloc(n * k / 16);
            zero[l][p] = malloc(n * k / 16);
            for (int64_t j = 0; j < n * k / 2; j++) codes[l][p][j] = rand();
            for (int64_t j = 0; j < n * k / 32; j++) { scale[l][p][j] = 0x3C00 + (rand() & 255); zero[l][p][j] = 0xBC00 + (rand() & 255); }
        }
    for (int l = 0; l < 90; l++)
        for (int i = 0; i < 7; i++) {
            const int64_t n = S1[i][0], k = S1[i][1];
            signs[l][i] = malloc(n * k / 8);
            alpha[l][i] = malloc(n * sizeof(float));
            for (int64_t j = 0; j < n * k / 8; j++) signs[l][i][j] = rand();
            for (int64_t j = 0; j < n; j++) alpha[l][i][j] = 0.001f * (rand() % 100);
        }
    x = malloc(16 * 1536 * sizeof(float));
    y = malloc(16 * 3072 * sizeof(float));
    float *first = malloc(16 * 3072 * sizeof(float));
    for (int i = 0; i < 16 * 1536; i++) x[i] = (rand() / (float)RAND_MAX - 0.5f) * (i % 37 ? 1.0f : 30.0f);
    const int Ms[5] = {1, 2, 4, 8, 16};
    for (int kernel = 0; kernel < 2; kernel++)
        for (int mi = 0; mi < 5; mi++) {
            const int M = Ms[mi];
            for (int v = 0; v < 2; v++) {   /* the same bits: the last layer's products, old then new */
                memset(y, 0, 16 * 3072 * sizeof(float));
                kernel ? sign_pass(v, M) : int4_pass(v, M);
                if (!v) memcpy(first, y, 16 * 3072 * sizeof(float));
                else if (memcmp(first, y, 16 * 3072 * sizeof(float))) { printf("the builds' bits differ\n"); return 1; }
            }
            double best[2] = {1e9, 1e9};
            for (int r = 0; r < 25; r++)
                for (int v = 0; v < 2; v++) {
                    const double start = now();
                    kernel ? sign_pass(v, M) : int4_pass(v, M);
                    const double t = (now() - start) / (kernel ? 3 : 1);   /* signs: per 30 layers */
                    if (t < best[v]) best[v] = t;
                }
            printf("%s, %2d rows of x: %6.3f -> %6.3f ms (%.2fx)\n", kernel ? "signs, 30 layers" : "int4, 8 layers  ", M,
                   best[0] * 1e3, best[1] * 1e3, best[1] / best[0]);
        }
    return 0;
}
"""

FILES = ("lanes.h", "x_rows.h", "kernels.h", "int4_gemv.c", "sign_add.c")


def build(sources: dict, work: Path, prefix: str) -> list[Path]:
    for name, text in sources.items():
        (work / name).write_text(text)
    flags = ["-O3", "-std=c11", "-ffp-contract=off", *native.ISA_FLAGS["avx2"], f"-I{work}", "-c"]
    renames = [f"-Dzenedge_int4_gemm={prefix}_int4", f"-Dzenedge_sign_rows={prefix}_rows",
               f"-Dzenedge_sign_add_rounded={prefix}_add", f"-Dzenedge_sign_add={prefix}_sign_add",
               f"-Dzenedge_sign_dense={prefix}_sign_dense"]
    objects = []
    for name in ("int4_gemv.c", "sign_add.c"):
        out = work / f"{prefix}_{name}.o"
        subprocess.run(["cc", *flags, *renames, "-o", str(out), str(work / name)], check=True)
        objects.append(out)
    return objects


def main() -> None:
    commit = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
    here = Path(native.__file__).parent
    old = {f: subprocess.run(["git", "show", f"{commit}:kernels/native/{f}"], check=True, capture_output=True,
                             text=True).stdout for f in FILES}
    new = {f: (here / f).read_text() for f in FILES}
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, tempfile.TemporaryDirectory() as c:
        objects = build(old, Path(a), "old") + build(new, Path(b), "new")
        driver = Path(c) / "driver.c"
        driver.write_text(DRIVER)
        subprocess.run(["cc", "-O2", *native.ISA_FLAGS["avx2"], f"-I{b}", "-o", str(Path(c) / "ab"), str(driver),
                        *map(str, objects), "-lm"], check=True)
        print(f"AVX2 builds, old: {commit}, new: the working tree; ms per pass, best of 25 interleaved rounds",
              flush=True)
        subprocess.run([str(Path(c) / "ab")], check=True)


if __name__ == "__main__":
    main()
