// Shared helpers of the cfm-plugins kernels (CPU and CUDA).
//
// CFM_HD marks functions compiled for both host and device so the CPU build runs (and the CPU
// tests check) the same arithmetic as the GPU. Nothing here includes torch headers: tensors cross
// kernel entry points as raw pointers plus sizes (unpacked from tensors in <kernel>_ops.h).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define CFM_HD __host__ __device__ __forceinline__
#else
#define CFM_HD inline
#endif
