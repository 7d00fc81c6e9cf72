// The conv TP CPU kernels compiled for AVX2 (x86-64 only; the bindings pick them at run time when
// the CPU has AVX2). No FMA contraction (-ffp-contract=off): the same results as the generic build.
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx2")
#define CFM_CONV_TP_ISA avx2
#include "conv_tp_cpu_impl.h"
#endif
