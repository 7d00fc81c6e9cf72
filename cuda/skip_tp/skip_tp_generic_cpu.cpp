// The skip-connection CPU kernels for the baseline instruction set of the compiler flags.
#define SKIP_NS(name) skip_generic_##name
#include "skip_tp_cpu_impl.h"
