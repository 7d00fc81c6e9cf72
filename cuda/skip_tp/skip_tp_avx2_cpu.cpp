// The skip-connection CPU kernels compiled for AVX2 (x86-64 only; skip_tp_ops.cpp picks them at run
// time when the CPU has AVX2). The kernels' inline code lives in an anonymous namespace of this
// file, so the linker never mixes AVX2 code into the baseline build.
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx2")
#define SKIP_NS(name) skip_avx2_##name
#include "skip_tp_cpu_impl.h"
#endif
