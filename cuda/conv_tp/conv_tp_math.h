// Arithmetic of the fused channelwise ("uvu") tensor product with scatter, shared by the CPU
// (conv_tp_cpu.cpp) and CUDA (conv_tp.cu) kernels. See cfm_plugins/ops/descriptors/conv_tp.py for
// the tables. Per edge e (node row `in` gathered from the other end, edge attributes y, weights w):
//
//   R[q]               = sum_{entries t of pair q} coef[t] * y[ent_j[t]]           (pair_coefs)
//   acc[out_q + c]    += R[q] * in[in_q + c] * w[woff_p + c]      for c < mul_p    (message_accumulate)
//
// The forward pass and the node-feature gradient (transposed tables) both run message_accumulate
// over the edges of one node segment. The weight and edge-attribute gradients run per edge:
//
//   gw[woff_p + c]    += R[q] * x[in_q + c] * g[out_q + c]                          (weight_grad_term)
//   D[q]               = sum_c x[in_q + c] * g[out_q + c] * w[woff_p + c]           (edge_attr_grad_term)
//   gy[ent_j[t]]      += coef[t] * D[q]
//
// Channel loops take a Lanes policy: CpuLanes (first 0, stride 1: contiguous, vectorizable) or,
// on the GPU, the thread's channel and the block's stride.
#pragma once
#include "cfm_common.h"

#if defined(__CUDACC__)
#define CFM_RESTRICT __restrict__
#else
#define CFM_RESTRICT __restrict__
#endif

namespace cfm {
namespace conv_tp {

// Raw views of the descriptor tables (host or device memory).
struct DescView {
  int n_paths;
  int n_pairs;
  int n_ents;
  const int* path_mul;
  const int* path_woff;
  const int* path_pair_start;
  const int* pair_in;
  const int* pair_out;
  const int* pair_ent_start;
  const int* ent_j;
  const double* ent_coef;
};

struct CpuLanes {
  static constexpr int first = 0;
  static constexpr int stride = 1;
};

struct StridedLanes {
  int first;
  int stride;
};

// R[q] for pairs [q0, q1) with a stride (threads of a block share the work on the GPU).
template <typename T>
CFM_HD_LOCAL void pair_coefs(const DescView& d, const T* CFM_RESTRICT y, T* CFM_RESTRICT R, int q0, int qstride) {
  for (int q = q0; q < d.n_pairs; q += qstride) {
    T r = T(0);
    for (int t = d.pair_ent_start[q]; t < d.pair_ent_start[q + 1]; ++t) r += T(d.ent_coef[t]) * y[d.ent_j[t]];
    R[q] = r;
  }
}

// The one multiply chain of the forward form (same order on CPU and GPU).
template <typename T>
CFM_HD_LOCAL T message_term(T r, T x, T w) { return (r * x) * w; }

// acc[out_q + c] += R[q] * in[in_q + c] * w[woff_p + c] for every pair of every path.
template <typename T, typename Lanes>
CFM_HD_LOCAL void message_accumulate(const DescView& d, const T* CFM_RESTRICT R, const T* CFM_RESTRICT in,
                               const T* CFM_RESTRICT w, T* CFM_RESTRICT acc, const Lanes& lanes) {
  for (int p = 0; p < d.n_paths; ++p) {
    const int C = d.path_mul[p];
    const T* CFM_RESTRICT wp = w + d.path_woff[p];
    for (int q = d.path_pair_start[p]; q < d.path_pair_start[p + 1]; ++q) {
      const T r = R[q];
      const T* CFM_RESTRICT xi = in + d.pair_in[q];
      T* CFM_RESTRICT o = acc + d.pair_out[q];
      for (int c = lanes.first; c < C; c += lanes.stride) o[c] += message_term(r, xi[c], wp[c]);
    }
  }
}

// Whether the paths' weight slots tile a weight row [0, dw) in path order (woff[p] = the earlier
// paths' channels): then the edge kernels store every element of a weight-gradient row (a path
// without pairs stores zeros) and its output needs no zero fill. The descriptor builder lays the
// weights out so (e3nn's flat layout); any other layout zeroes the row in the kernel first.
CFM_HD_LOCAL bool weights_tiled(const DescView& d, long long dw) {
  long long off = 0;
  for (int p = 0; p < d.n_paths; ++p) {
    if (d.path_woff[p] != off) return false;
    off += d.path_mul[p];
  }
  return off == dw;
}

// Per-channel pieces of the per-edge gradients.
template <typename T>
CFM_HD_LOCAL T weight_grad_term(T r, T x, T g) { return r * (x * g); }

template <typename T>
CFM_HD_LOCAL T edge_attr_grad_term(T x, T g, T w) { return (x * g) * w; }

}  // namespace conv_tp
}  // namespace cfm
