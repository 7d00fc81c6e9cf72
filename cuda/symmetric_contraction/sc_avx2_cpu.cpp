// The CPU kernels compiled for AVX2 (x86-64 only; sc_ops.cpp picks them at run time when the
// CPU has AVX2). sc_math.h's inline code goes to its own namespace (CFM_SC_ISA) and the drivers are
// internal to this file, so the linker never mixes AVX2 code into the baseline build.
#if defined(__x86_64__) && defined(__GNUC__)
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cfm_common.h"
#include "sc_cpu_api.h"  // declarations only (Desc and ScArgs are plain structs)
#pragma GCC target("avx2")
#undef CFM_SC_ISA
#define CFM_SC_ISA isa_avx2
#define SC_CPU_NS(name) sc_avx2_##name
#include "sc_cpu_impl.h"
#endif
