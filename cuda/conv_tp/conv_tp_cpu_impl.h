// CPU kernels of the fused conv TP (OpenMP over node segments / edge chunks, channels innermost).
// Deterministic: each node row is accumulated by one thread in CSR edge order; no atomics.
//
// Included by conv_tp_generic_cpu.cpp and conv_tp_avx2_cpu.cpp with CFM_CONV_TP_ISA naming the
// namespace of the entry points (one instruction set each); everything else is in an anonymous
// namespace or has internal linkage (conv_tp_math.h), so no code is shared between them.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include "conv_tp_host.h"

namespace cfm {
namespace conv_tp {
namespace CFM_CONV_TP_ISA {
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

// The gradients of one edge: gw_row (GW) and gy_row (GY) from its sender row xr, receiver row gr,
// attributes yr and weights wr_row. R holds the edge's pair coefficients (filled here when GW).
template <typename T, bool GY, bool GW>
inline void edge_grad_row(const DescView& d, bool tiled, std::int64_t dw, const T* xr, const T* gr, const T* yr,
                          const T* wr_row, T* gy_row, std::int64_t dy, T* gw_row, T* R) {
  if (GW) pair_coefs(d, yr, R, 0, 1);
  if (GW && !tiled) std::fill(gw_row, gw_row + dw, T(0));
  if (GY) std::fill(gy_row, gy_row + dy, T(0));
  for (int p = 0; p < d.n_paths; ++p) {
    const int C = d.path_mul[p];
    const T* CFM_RESTRICT wp = wr_row + d.path_woff[p];
    const int q0 = d.path_pair_start[p], q1 = d.path_pair_start[p + 1];
    if (GW && tiled && q0 == q1)  // a path without pairs: zeros in its slots
      std::fill(gw_row + d.path_woff[p], gw_row + d.path_woff[p] + C, T(0));
    for (int q = q0; q < q1; ++q) {
      const T* CFM_RESTRICT xi = xr + d.pair_in[q];
      const T* CFM_RESTRICT gk = gr + d.pair_out[q];
      if (GW) {
        T* CFM_RESTRICT gwp = gw_row + d.path_woff[p];
        const T r = R[q];
        if (tiled && q == q0)
          for (int c = 0; c < C; ++c) gwp[c] = weight_grad_term(r, xi[c], gk[c]);
        else
          for (int c = 0; c < C; ++c) gwp[c] += weight_grad_term(r, xi[c], gk[c]);
      }
      if (GY) {
        const T D = channel_dot3(xi, gk, wp, C);
        for (int t = d.pair_ent_start[q]; t < d.pair_ent_start[q + 1]; ++t) gy_row[d.ent_j[t]] += T(d.ent_coef[t]) * D;
      }
    }
  }
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
      for (std::int64_t e = chunk * kEdgeChunk; e < e1; ++e)
        edge_grad_row<T, GY, GW>(d, tiled, dw, x + sender[e] * dx, g + receiver[e] * dg, y + e * dy, w + e * dw,
                                 GY ? gy + e * dy : nullptr, dy, GW ? gw + e * dw : nullptr, R.data());
    }
  }
}

// ---- the radial form: weights w[e] = h[e] @ wr, made per block of edges in a thread-local buffer ----

constexpr std::int64_t kRadialBlock = 64;  // edges whose weights one GEMM makes

// A 64-byte aligned scratch array (aligned alike in every call, so that the BLAS takes the same path).
template <typename T>
struct Scratch {
  std::unique_ptr<T, decltype(&std::free)> p{nullptr, &std::free};
  explicit Scratch(std::int64_t n) {
    const std::size_t bytes = ((std::max<std::int64_t>(n, 1) * sizeof(T) + 63) / 64) * 64;
    p.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
  }
  T* get() const { return p.get(); }
};

// Edge slabs of the radial weight gradient: each slab's partial sum is made by one thread in edge
// order, and the partials are added in slab order, so the sum does not depend on the thread count.
inline std::int64_t radial_slabs(std::int64_t n_edges) {
  return std::max<std::int64_t>(1, std::min<std::int64_t>(32, (n_edges + 511) / 512));
}

template <typename T, bool GY, bool GW>
void edge_grads_radial_impl(const DescView& d, std::int64_t n_edges, const std::int64_t* sender,
                            const std::int64_t* receiver, const T* x, std::int64_t dx, const T* g, std::int64_t dg,
                            const T* y, std::int64_t dy, const T* h, std::int64_t K, const T* wr, std::int64_t dw,
                            T* gy, T* gh, T* gwr, int num_threads) {
  const bool tiled = weights_tiled(d, dw);
  const std::int64_t n_slabs = radial_slabs(n_edges), per_slab = (n_edges + n_slabs - 1) / n_slabs;
  Scratch<T> parts(gwr ? n_slabs * K * dw : 1);
  num_threads = threads_for(n_edges * (edge_work(d) + 2 * K * dw), num_threads);
#pragma omp parallel num_threads(num_threads) if (num_threads > 1 && n_slabs > 1)
  {
    std::vector<T> R(std::max(1, d.n_pairs));
    Scratch<T> wbuf(GY ? kRadialBlock * dw : 1), gwbuf(GW ? kRadialBlock * dw : 1);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t s = 0; s < n_slabs; ++s) {
      const std::int64_t a = std::min(n_edges, s * per_slab), b = std::min(n_edges, a + per_slab);
      T* part = gwr ? parts.get() + s * K * dw : nullptr;
      if (part && a == b) std::fill(part, part + K * dw, T(0));
      for (std::int64_t e0 = a; e0 < b; e0 += kRadialBlock) {
        const std::int64_t nb = std::min(kRadialBlock, b - e0);
        if (GY) gemm_rm<T>(false, false, nb, dw, K, h + e0 * K, K, wr, dw, T(0), wbuf.get(), dw);
        for (std::int64_t i = 0; i < nb; ++i) {
          const std::int64_t e = e0 + i;
          edge_grad_row<T, GY, GW>(d, tiled, dw, x + sender[e] * dx, g + receiver[e] * dg, y + e * dy,
                                   GY ? wbuf.get() + i * dw : nullptr, GY ? gy + e * dy : nullptr, dy,
                                   GW ? gwbuf.get() + i * dw : nullptr, R.data());
        }
        if (GW && gh) gemm_rm<T>(false, true, nb, K, dw, gwbuf.get(), dw, wr, dw, T(0), gh + e0 * K, K);
        if (GW && part) gemm_rm<T>(true, false, K, dw, nb, h + e0 * K, K, gwbuf.get(), dw, e0 == a ? T(0) : T(1), part, dw);
      }
    }
  }
  if (!gwr) return;
  // gwr = the partials summed in slab order (columns split between threads: the order per element is fixed)
  const std::int64_t n = K * dw;
  const T* P = parts.get();
#pragma omp parallel for num_threads(num_threads) if (num_threads > 1) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    T acc = P[i];
    for (std::int64_t s = 1; s < n_slabs; ++s) acc += P[s * n + i];
    gwr[i] = acc;
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

template <typename T>
void segment_accumulate_radial(const DescView& d, std::int64_t n_nodes, const std::int64_t* ptr,
                               const std::int64_t* perm, const std::int64_t* other, const T* node_in, std::int64_t din,
                               const T* y, std::int64_t dy, const T* h, std::int64_t K, const T* wr, std::int64_t dw,
                               T* out, std::int64_t dout, int num_threads) {
  const std::int64_t n_edges = n_nodes > 0 ? ptr[n_nodes] - ptr[0] : 0;
  num_threads = threads_for(n_edges * (edge_work(d) + K * dw), num_threads);
#pragma omp parallel num_threads(num_threads) if (num_threads > 1 && n_nodes > 1)
  {
    std::vector<T> R(std::max(1, d.n_pairs));
    Scratch<T> hbuf(kRadialBlock * K), wbuf(kRadialBlock * dw);
#pragma omp for schedule(dynamic, 4)
    for (std::int64_t n = 0; n < n_nodes; ++n) {
      T* acc = out + n * dout;
      std::fill(acc, acc + dout, T(0));  // written whole (isolated nodes, gaps): no fill before
      for (std::int64_t k0 = ptr[n]; k0 < ptr[n + 1]; k0 += kRadialBlock) {
        const std::int64_t nb = std::min(kRadialBlock, ptr[n + 1] - k0);
        for (std::int64_t i = 0; i < nb; ++i) std::copy_n(h + perm[k0 + i] * K, K, hbuf.get() + i * K);
        gemm_rm<T>(false, false, nb, dw, K, hbuf.get(), K, wr, dw, T(0), wbuf.get(), dw);
        for (std::int64_t i = 0; i < nb; ++i) {
          const std::int64_t e = perm[k0 + i];
          pair_coefs(d, y + e * dy, R.data(), 0, 1);
          message_accumulate(d, R.data(), node_in + other[e] * din, wbuf.get() + i * dw, acc, CpuLanes{});
        }
      }
    }
  }
}

template <typename T>
void edge_grads_radial(const DescView& d, std::int64_t n_edges, const std::int64_t* sender,
                       const std::int64_t* receiver, const T* x, std::int64_t dx, const T* g, std::int64_t dg,
                       const T* y, std::int64_t dy, const T* h, std::int64_t K, const T* wr, std::int64_t dw, T* gy,
                       T* gh, T* gwr, int num_threads) {
  const bool gw = gh || gwr;
  if (gy && gw)
    edge_grads_radial_impl<T, true, true>(d, n_edges, sender, receiver, x, dx, g, dg, y, dy, h, K, wr, dw, gy, gh,
                                          gwr, num_threads);
  else if (gy)
    edge_grads_radial_impl<T, true, false>(d, n_edges, sender, receiver, x, dx, g, dg, y, dy, h, K, wr, dw, gy,
                                           nullptr, nullptr, num_threads);
  else if (gw)
    edge_grads_radial_impl<T, false, true>(d, n_edges, sender, receiver, x, dx, g, dg, y, dy, h, K, wr, dw, nullptr,
                                           gh, gwr, num_threads);
}

#define CFM_CONV_TP_INSTANTIATE(T)                                                                                \
  template void segment_accumulate<T>(const DescView&, std::int64_t, const std::int64_t*, const std::int64_t*,  \
                                      const std::int64_t*, const T*, std::int64_t, const T*, std::int64_t,      \
                                      const T*, std::int64_t, T*, std::int64_t, int);                           \
  template void edge_grads<T>(const DescView&, std::int64_t, const std::int64_t*, const std::int64_t*, const T*, \
                              std::int64_t, const T*, std::int64_t, const T*, std::int64_t, const T*,           \
                              std::int64_t, T*, T*, int);                                                  \
  template void segment_accumulate_radial<T>(const DescView&, std::int64_t, const std::int64_t*,               \
                                             const std::int64_t*, const std::int64_t*, const T*, std::int64_t, \
                                             const T*, std::int64_t, const T*, std::int64_t, const T*,         \
                                             std::int64_t, T*, std::int64_t, int);                             \
  template void edge_grads_radial<T>(const DescView&, std::int64_t, const std::int64_t*, const std::int64_t*,  \
                                     const T*, std::int64_t, const T*, std::int64_t, const T*, std::int64_t,   \
                                     const T*, std::int64_t, const T*, std::int64_t, T*, T*, T*, int);
CFM_CONV_TP_INSTANTIATE(float)
CFM_CONV_TP_INSTANTIATE(double)
#undef CFM_CONV_TP_INSTANTIATE

}  // namespace CFM_CONV_TP_ISA
}  // namespace conv_tp
}  // namespace cfm
