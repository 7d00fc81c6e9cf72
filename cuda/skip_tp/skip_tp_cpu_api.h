// Arguments of the skip-connection kernels (CPU; raw pointers unpacked from tensors once, in
// skip_tp_ops.h) and their entry points, compiled once per instruction set (skip_tp_generic_cpu.cpp,
// skip_tp_avx2_cpu.cpp; skip_tp_ops.cpp picks at run time).
#pragma once
#include <cstdint>

namespace cfm {
namespace skip_tp {

// The tables of one orientation (cfm_plugins/ops/descriptors/skip_tp.py, SkipTPDescriptor.packed):
// blocks (dst_off, dst_mul, dim) | path_ptr [n_blocks + 1] | paths (src_off, K, woff, k_stride,
// n_stride, e_stride); coef per path.
struct Tables {
  int n_blocks = 0, n_paths = 0;
  const std::int32_t* blocks = nullptr;
  const std::int32_t* path_ptr = nullptr;
  const std::int32_t* paths = nullptr;
  const double* coef = nullptr;
  std::int64_t dim_src = 0, dim_dst = 0, num_elements = 0, weight_numel = 0;
};

// The nodes of one call grouped by element: order [N] (nodes sorted by element), elem_ptr [E + 1]
// (the nodes of element e are order[elem_ptr[e]:elem_ptr[e+1]]).
struct Groups {
  std::int64_t n_nodes = 0;
  const std::int64_t* order = nullptr;
  const std::int64_t* elem_ptr = nullptr;
};

// dst[n] = the per-element linear map of src[n] (forward: x -> out with the forward tables; node
// feature gradient: g -> gx with the transposed ones). Writes every element of dst [N, dim_dst].
// wgrad: gw [weight_numel] = d<g, out>/dW from x and g (forward tables); writes every element.
#define CFM_SKIP_TP_DECLARE(NS)                                                                       \
  void NS##_apply(bool is_double, const Tables& t, const Groups& grp, const void* src, const void* w, \
                  void* dst, int nthreads);                                                           \
  void NS##_wgrad(bool is_double, const Tables& t, const Groups& grp, const void* x, const void* g,   \
                  void* gw, int nthreads);

CFM_SKIP_TP_DECLARE(skip_generic)
#if defined(__x86_64__) && defined(__GNUC__)
#define CFM_SKIP_TP_HAVE_AVX2 1
CFM_SKIP_TP_DECLARE(skip_avx2)
#endif
#undef CFM_SKIP_TP_DECLARE

}  // namespace skip_tp
}  // namespace cfm
