// The CPU kernel entry points of the fused conv TP (bound in conv_tp_ops.cpp and
// conv_tp_radial_ops.cpp), compiled once per instruction set (conv_tp_generic_cpu.cpp,
// conv_tp_avx2_cpu.cpp; the bindings pick at run time). Pointers are raw (unpacked from tensors in
// conv_tp_ops.h); rows are contiguous; indices are int64.
#pragma once
#include <cstdint>

#include "conv_tp_math.h"

namespace cfm {
namespace conv_tp {

// C[m, n] = op(A) @ op(B) + beta * C, row-major (op: the transpose where ta / tb), with the BLAS
// torch links (MKL's sgemm/dgemm) when it exports one, else plain loops (conv_tp_gemm_cpu.cpp).
// Sequential: called inside the kernels' OpenMP regions.
template <typename T>
void gemm_rm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const T* A, std::int64_t lda,
             const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc);

// Per instruction set (NS):
//
// segment_accumulate: out[n] = the sum over the edges of segment n (perm[ptr[n]:ptr[n+1]]) of the
// message built from node_in[other[e]], y[e], w[e]. Every row n < n_nodes of `out` is written
// (zeroed in the kernel, then summed): `out` may be uninitialised.
//
// edge_grads: per-edge gradients gw[e] (if gw != nullptr) and gy[e] (if gy != nullptr) from
// x[sender[e]], g[receiver[e]], y[e], w[e]. Every element of their rows is written.
//
// segment_accumulate_radial / edge_grads_radial: the same with the weights w[e] = h[e] @ wr
// (h [E, K], wr [K, dw]) made per block of edges in a thread-local buffer, never stored; the
// radial edge pass returns gh[e] = gw[e] @ wr^T and gwr = sum_e h[e]^T gw[e] (each written whole)
// in place of gw.
#define CFM_CONV_TP_DECLARE(NS)                                                                                    \
  namespace NS {                                                                                                   \
  template <typename T>                                                                                            \
  void segment_accumulate(const DescView& d, std::int64_t n_nodes, const std::int64_t* ptr,                       \
                          const std::int64_t* perm, const std::int64_t* other, const T* node_in, std::int64_t din, \
                          const T* y, std::int64_t dy, const T* w, std::int64_t dw, T* out, std::int64_t dout,     \
                          int num_threads);                                                                        \
  template <typename T>                                                                                            \
  void edge_grads(const DescView& d, std::int64_t n_edges, const std::int64_t* sender,                            \
                  const std::int64_t* receiver, const T* x, std::int64_t dx, const T* g, std::int64_t dg,         \
                  const T* y, std::int64_t dy, const T* w, std::int64_t dw, T* gy, T* gw, int num_threads);        \
  template <typename T>                                                                                            \
  void segment_accumulate_radial(const DescView& d, std::int64_t n_nodes, const std::int64_t* ptr,                \
                                 const std::int64_t* perm, const std::int64_t* other, const T* node_in,           \
                                 std::int64_t din, const T* y, std::int64_t dy, const T* h, std::int64_t K,       \
                                 const T* wr, std::int64_t dw, T* out, std::int64_t dout, int num_threads);       \
  template <typename T>                                                                                            \
  void edge_grads_radial(const DescView& d, std::int64_t n_edges, const std::int64_t* sender,                     \
                         const std::int64_t* receiver, const T* x, std::int64_t dx, const T* g, std::int64_t dg, \
                         const T* y, std::int64_t dy, const T* h, std::int64_t K, const T* wr, std::int64_t dw,   \
                         T* gy, T* gh, T* gwr, int num_threads);                                                   \
  }

CFM_CONV_TP_DECLARE(generic)
#if defined(__x86_64__) && defined(__GNUC__)
#define CFM_CONV_TP_HAVE_AVX2 1
CFM_CONV_TP_DECLARE(avx2)
#endif
#undef CFM_CONV_TP_DECLARE

// Whether the AVX2 build of the kernels runs here.
inline bool use_avx2() {
#if defined(CFM_CONV_TP_HAVE_AVX2)
  static const bool ok = __builtin_cpu_supports("avx2");
  return ok;
#else
  return false;
#endif
}

}  // namespace conv_tp
}  // namespace cfm
