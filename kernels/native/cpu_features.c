/* Which instruction sets this CPU runs, for choosing the kernels' build (kernels/native/__init__.py).
 *
 * Asked of the compiler's runtime on x86 (__builtin_cpu_supports: CPUID, and whether the OS saves
 * the wider registers), of the kernel's hardware capabilities on Linux ARM64 (getauxval), and of
 * sysctl on macOS: no /proc/cpuinfo, which macOS does not have. Built with no instruction-set flags,
 * so it runs on any CPU of its architecture. Returns a bit per feature, in FEATURES' order there.
 */
#include <stdint.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif
#if defined(__APPLE__)
#include <sys/sysctl.h>
#endif

enum { AVX512F = 1, AVX512BW = 2, AVX512VL = 4, AVX512BF16 = 8, AVX2 = 16, FMA = 32, F16C = 64, NEON = 128, DOTPROD = 256,
       AVX512VNNI = 512 };

int64_t zenedge_cpu_features(void) {
    int64_t found = 0;
#if defined(__x86_64__)
    __builtin_cpu_init();
    found |= __builtin_cpu_supports("avx512f") ? AVX512F : 0;
    found |= __builtin_cpu_supports("avx512bw") ? AVX512BW : 0;
    found |= __builtin_cpu_supports("avx512vl") ? AVX512VL : 0;
    found |= __builtin_cpu_supports("avx512bf16") ? AVX512BF16 : 0;
    found |= __builtin_cpu_supports("avx512vnni") ? AVX512VNNI : 0;
    found |= __builtin_cpu_supports("avx2") ? AVX2 : 0;
    found |= __builtin_cpu_supports("fma") ? FMA : 0;
    /* F16C from CPUID leaf 1 (ECX bit 29): clang 14 does not know "f16c" in __builtin_cpu_supports; it
       needs the OS to save the AVX registers, which AVX2's answer above includes */
    unsigned int eax, ebx, ecx, edx;
    found |= (found & AVX2) && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) ? F16C : 0;
#elif defined(__aarch64__)
    found |= NEON;   /* every ARM64 CPU has Advanced SIMD */
#if defined(__linux__)
    found |= (getauxval(AT_HWCAP) & (1UL << 20)) ? DOTPROD : 0;   /* HWCAP_ASIMDDP */
#elif defined(__APPLE__)
    int dotprod = 0;
    size_t size = sizeof dotprod;
    found |= (sysctlbyname("hw.optional.arm.FEAT_DotProd", &dotprod, &size, NULL, 0) == 0 && dotprod) ? DOTPROD : 0;
#endif
#endif
    return found;
}
