// The CPU kernel entry points of the fused conv TP (bound in conv_tp_ops.cpp).
// Pointers are raw (unpacked from tensors in conv_tp_ops.h); rows are contiguous; indices are int64.
#pragma once
#include <cstdint>

#include "conv_tp_math.h"

namespace cfm {
namespace conv_tp {

// out[n] += sum over the edges of segment n (perm[ptr[n]:ptr[n+1]]) of the message built from
// node_in[other[e]], y[e], w[e]. Every row n < n_nodes of `out` is written (zeroed in the kernel,
// then summed): `out` may be uninitialised.
template <typename T>
void segment_accumulate(const DescView& d, std::int64_t n_nodes, const std::int64_t* ptr, const std::int64_t* perm,
                        const std::int64_t* other, const T* node_in, std::int64_t din, const T* y, std::int64_t dy,
                        const T* w, std::int64_t dw, T* out, std::int64_t dout, int num_threads);

// Per-edge gradients: gw[e] (if gw != nullptr) and gy[e] (if gy != nullptr) from x[sender[e]],
// g[receiver[e]], y[e], w[e]. Every element of the rows of gw and gy is written (gy and, where
// the paths do not tile the weights (weights_tiled), gw zeroed per edge in the kernel): they may be
// uninitialised.
template <typename T>
void edge_grads(const DescView& d, std::int64_t n_edges, const std::int64_t* sender, const std::int64_t* receiver,
                const T* x, std::int64_t dx, const T* g, std::int64_t dg, const T* y, std::int64_t dy, const T* w,
                std::int64_t dw, T* gy, T* gw, int num_threads);

}  // namespace conv_tp
}  // namespace cfm
