// CPU kernels of the fused conv TP (OpenMP over node segments / edge chunks, channels innermost).
// Deterministic: each node row is accumulated by one thread in CSR edge order; no atomics.
#include <algorithm>
#include <vector>

#include "conv_tp_host.h"

namespace cfm {
namespace conv_tp {

namespace {

constexpr std::int64_t kEdgeChunk = 64;

// Channel multiply-adds per edge (one per pair and channel).
inline std::int64_t edge_work(const DescView& d) {
  std::int64_t w = 0;
  for (int p = 0; p < d.n_paths; ++p)
    w += std::int64_t(d.path_mul[p]) * (d.path_pair_start[p + 1] - d.path_pair_start[p]);
  return w;
}

// Small problems run on one thread: waking a team costs more than the work (and, on a loaded
// machine, a descheduled team member stalls the whole region).
inline int threads_for(std::int64_t work, int requested) {
  constexpr std::int64_t kMinWorkPerThread = std::int64_t(1) << 17;
  const std::int64_t by_work = work / kMinWorkPerThread;
  if (by_work < 2) return 1;
  return static_cast<int>(std::min<std::int64_t>(requested, by_work));
}

template <typename T>
inline T channel_dot3(const T* CFM_RESTRICT x, const T* CFM_RESTRICT g, const T* CFM_RESTRICT w, int C) {
  // Fixed 8-lane partial sums: vectorizable without -ffast-math, and the same order every run.
  T part[8] = {T(0), T(0), T(0), T(0), T(0), T(0), T(0), T(0)};
  int c = 0;
  for (; c + 8 <= C; c += 8)
    for (int l = 0; l < 8; ++l) part[l] += edge_attr_grad_term(x[c + l], g[c + l], w[c + l]);
  T tail = T(0);
  for (; c < C; ++c) tail += edge_attr_grad_term(x[c], g[c], w[c]);
  return (((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]))) + tail;
}

template <typename T, bool GY, bool GW>
void edge_grads_impl(const DescView& d, std::int64_t n_edges, const std::int64_t* sender,
                     const std::int64_t* receiver, const T* x, std::int64_t dx, const T* g, std::int64_t dg,
                     const T* y, std::int64_t dy, const T* w, std::int64_t dw, T* gy, T* gw, int num_threads) {
  const std::int64_t n_chunks = (n_edges + kEdgeChunk - 1) / kEdgeChunk;
  num_threads = threads_for(n_edges * edge_work(d), num_threads);
  // The first pair of a path stores its weight-gradient slots, the others add: every slot of a row
  // is stored once the paths tile it (else the row is zeroed first). gy rows are zeroed here.
  const bool tiled = weights_tiled(d, dw);
#pragma omp parallel num_threads(num_threads) if (num_threads > 1 && n_chunks > 1)
  {
    std::vector<T> R(std::max(1, d.n_pairs));
#pragma omp for schedule(dynamic, 2)
    for (std::int64_t chunk = 0; chunk < n_chunks; ++chunk) {
      const std::int64_t e1 = std::min(n_edges, (chunk + 1) * kEdgeChunk);
      for (std::int64_t e = chunk * kEdgeChunk; e < e1; ++e) {
        const T* xr = x + sender[e] * dx;
        const T* gr = g + receiver[e] * dg;
        const T* wr = w + e * dw;
        if (GW) pair_coefs(d, y + e * dy, R.data(), 0, 1);
        if (GW && !tiled) std::fill(gw + e * dw, gw + (e + 1) * dw, T(0));
        if (GY) std::fill(gy + e * dy, gy + (e + 1) * dy, T(0));
        for (int p = 0; p < d.n_paths; ++p) {
          const int C = d.path_mul[p];
          const T* CFM_RESTRICT wp = wr + d.path_woff[p];
          const int q0 = d.path_pair_start[p], q1 = d.path_pair_start[p + 1];
          if (GW && tiled && q0 == q1)  // a path without pairs: zeros in its slots
            std::fill(gw + e * dw + d.path_woff[p], gw + e * dw + d.path_woff[p] + C, T(0));
          for (int q = q0; q < q1; ++q) {
            const T* CFM_RESTRICT xi = xr + d.pair_in[q];
            const T* CFM_RESTRICT gk = gr + d.pair_out[q];
            if (GW) {
              T* CFM_RESTRICT gwp = gw + e * dw + d.path_woff[p];
              const T r = R[q];
              if (tiled && q == q0)
                for (int c = 0; c < C; ++c) gwp[c] = weight_grad_term(r, xi[c], gk[c]);
              else
                for (int c = 0; c < C; ++c) gwp[c] += weight_grad_term(r, xi[c], gk[c]);
            }
            if (GY) {
              const T D = channel_dot3(xi, gk, wp, C);
              T* gyr = gy + e * dy;
              for (int t = d.pair_ent_start[q]; t < d.pair_ent_start[q + 1]; ++t) gyr[d.ent_j[t]] += T(d.ent_coef[t]) * D;
            }
          }
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void segment_accumulate(const DescView& d, std::int64_t n_nodes, const std::int64_t* ptr, const std::int64_t* perm,
                        const std::int64_t* other, const T* node_in, std::int64_t din, const T* y, std::int64_t dy,
                        const T* w, std::int64_t dw, T* out, std::int64_t dout, int num_threads) {
  num_threads = threads_for((n_nodes > 0 ? ptr[n_nodes] - ptr[0] : 0) * edge_work(d), num_threads);
#pragma omp parallel num_threads(num_threads) if (num_threads > 1 && n_nodes > 1)
  {
    std::vector<T> R(std::max(1, d.n_pairs));
#pragma omp for schedule(dynamic, 4)
    for (std::int64_t n = 0; n < n_nodes; ++n) {
      T* acc = out + n * dout;
      std::fill(acc, acc + dout, T(0));  // written whole (isolated nodes, gaps): no fill before
      for (std::int64_t k = ptr[n]; k < ptr[n + 1]; ++k) {
        const std::int64_t e = perm[k];
        pair_coefs(d, y + e * dy, R.data(), 0, 1);
        message_accumulate(d, R.data(), node_in + other[e] * din, w + e * dw, acc, CpuLanes{});
      }
    }
  }
}

template <typename T>
void edge_grads(const DescView& d, std::int64_t n_edges, const std::int64_t* sender, const std::int64_t* receiver,
                const T* x, std::int64_t dx, const T* g, std::int64_t dg, const T* y, std::int64_t dy, const T* w,
                std::int64_t dw, T* gy, T* gw, int num_threads) {
  if (gy && gw)
    edge_grads_impl<T, true, true>(d, n_edges, sender, receiver, x, dx, g, dg, y, dy, w, dw, gy, gw, num_threads);
  else if (gy)
    edge_grads_impl<T, true, false>(d, n_edges, sender, receiver, x, dx, g, dg, y, dy, w, dw, gy, gw, num_threads);
  else if (gw)
    edge_grads_impl<T, false, true>(d, n_edges, sender, receiver, x, dx, g, dg, y, dy, w, dw, gy, gw, num_threads);
}

#define CFM_CONV_TP_INSTANTIATE(T)                                                                                \
  template void segment_accumulate<T>(const DescView&, std::int64_t, const std::int64_t*, const std::int64_t*,  \
                                      const std::int64_t*, const T*, std::int64_t, const T*, std::int64_t,      \
                                      const T*, std::int64_t, T*, std::int64_t, int);                           \
  template void edge_grads<T>(const DescView&, std::int64_t, const std::int64_t*, const std::int64_t*, const T*, \
                              std::int64_t, const T*, std::int64_t, const T*, std::int64_t, const T*,           \
                              std::int64_t, T*, T*, int);
CFM_CONV_TP_INSTANTIATE(float)
CFM_CONV_TP_INSTANTIATE(double)
#undef CFM_CONV_TP_INSTANTIATE

}  // namespace conv_tp
}  // namespace cfm
