// Host-side descriptor storage and the CPU kernel entry points of the fused conv TP.
// Pointers are raw (tensor.data_ptr()); rows are contiguous; indices are int64.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "conv_tp_math.h"

namespace cfm {
namespace conv_tp {

// Owns the descriptor tables (built once per module in Python, see descriptors/conv_tp.py).
struct HostDescriptor {
  std::vector<int> path_mul, path_woff, path_pair_start, pair_in, pair_out, pair_ent_start, ent_j;
  std::vector<double> ent_coef;

  HostDescriptor(std::vector<int> path_mul_, std::vector<int> path_woff_, std::vector<int> path_pair_start_,
                 std::vector<int> pair_in_, std::vector<int> pair_out_, std::vector<int> pair_ent_start_,
                 std::vector<int> ent_j_, std::vector<double> ent_coef_)
      : path_mul(std::move(path_mul_)), path_woff(std::move(path_woff_)),
        path_pair_start(std::move(path_pair_start_)), pair_in(std::move(pair_in_)), pair_out(std::move(pair_out_)),
        pair_ent_start(std::move(pair_ent_start_)), ent_j(std::move(ent_j_)), ent_coef(std::move(ent_coef_)) {
    const size_t P = path_mul.size(), Q = pair_in.size(), NE = ent_j.size();
    if (path_woff.size() != P || path_pair_start.size() != P + 1 || pair_out.size() != Q ||
        pair_ent_start.size() != Q + 1 || ent_coef.size() != NE)
      throw std::invalid_argument("conv_tp descriptor: inconsistent table sizes");
    if (path_pair_start[P] != static_cast<int>(Q) || pair_ent_start[Q] != static_cast<int>(NE))
      throw std::invalid_argument("conv_tp descriptor: table ends do not match");
  }

  DescView view() const {
    return DescView{static_cast<int>(path_mul.size()), static_cast<int>(pair_in.size()),
                    static_cast<int>(ent_j.size()), path_mul.data(), path_woff.data(),
                    path_pair_start.data(), pair_in.data(), pair_out.data(), pair_ent_start.data(),
                    ent_j.data(), ent_coef.data()};
  }
};

// out[n] += sum over the edges of segment n (perm[ptr[n]:ptr[n+1]]) of the message built from
// node_in[other[e]], y[e], w[e]. `out` must be zero-initialised by the caller.
template <typename T>
void segment_accumulate(const DescView& d, std::int64_t n_nodes, const std::int64_t* ptr, const std::int64_t* perm,
                        const std::int64_t* other, const T* node_in, std::int64_t din, const T* y, std::int64_t dy,
                        const T* w, std::int64_t dw, T* out, std::int64_t dout, int num_threads);

// Per-edge gradients: gw[e] (if gw != nullptr) and gy[e] (if gy != nullptr) from x[sender[e]],
// g[receiver[e]], y[e], w[e]. gw and gy must be zero-initialised by the caller.
template <typename T>
void edge_grads(const DescView& d, std::int64_t n_edges, const std::int64_t* sender, const std::int64_t* receiver,
                const T* x, std::int64_t dx, const T* g, std::int64_t dg, const T* y, std::int64_t dy, const T* w,
                std::int64_t dw, T* gy, T* gw, int num_threads);

}  // namespace conv_tp
}  // namespace cfm
