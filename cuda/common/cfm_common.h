// Shared helpers of the cfm-plugins kernels (CPU and CUDA).
//
// CFM_HD marks functions compiled for both host and device so the CPU build runs (and the CPU
// tests check) the same arithmetic as the GPU. Nothing here includes torch headers: tensors cross
// kernel entry points as raw pointers plus sizes (unpacked from tensors in <kernel>_ops.h).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define CFM_HD __host__ __device__ __forceinline__
#define CFM_HD_LOCAL static __host__ __device__ __forceinline__
#else
#define CFM_HD inline
// A free function with internal linkage: each translation unit (one per instruction set on the CPU)
// keeps its own copy, so the linker never hands one instruction set's code to another's caller.
#define CFM_HD_LOCAL static inline
#endif
