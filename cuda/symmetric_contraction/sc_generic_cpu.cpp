// The CPU kernels for the baseline instruction set of the compiler flags.
#define SC_CPU_NS(name) sc_generic_##name
#include "sc_cpu_impl.h"
