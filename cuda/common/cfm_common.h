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

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace cfm {

// Run body(i) for i in [0, n) on up to num_threads threads (OpenMP when built with it).
template <typename F>
inline void parallel_for(std::int64_t n, int num_threads, F&& body) {
#if defined(_OPENMP)
  if (num_threads > 1 && n > 1) {
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#endif
  for (std::int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace cfm
