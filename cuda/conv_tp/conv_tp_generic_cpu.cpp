// The conv TP CPU kernels for the baseline instruction set of the compiler flags.
#define CFM_CONV_TP_ISA generic
#include "conv_tp_cpu_impl.h"
