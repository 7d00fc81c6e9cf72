// CUDA entry points of the fused conv TP (implemented in conv_tp.cu, bound in bindings_cuda.cpp).
// No torch and no pybind11 here: raw device pointers, sizes, and the CUDA stream as an integer.
#pragma once
#include <cstdint>
#include <vector>

namespace cfm {
namespace conv_tp {
namespace gpu {

// Descriptor tables copied once to device memory (see descriptors/conv_tp.py).
struct DeviceDescriptor;

DeviceDescriptor* create_descriptor(const std::vector<int>& path_mul, const std::vector<int>& path_woff,
                                    const std::vector<int>& path_pair_start, const std::vector<int>& pair_in,
                                    const std::vector<int>& pair_out, const std::vector<int>& pair_ent_start,
                                    const std::vector<int>& ent_j, const std::vector<double>& ent_coef);
void destroy_descriptor(DeviceDescriptor* d);

// dtype: 0 float32, 1 float64. `out` zero-initialised by the caller (on `stream`).
void segment_accumulate(const DeviceDescriptor* d, int dtype, std::int64_t n_nodes, std::uintptr_t ptr,
                        std::uintptr_t perm, std::uintptr_t other, std::uintptr_t node_in, std::int64_t din,
                        std::uintptr_t y, std::int64_t dy, std::uintptr_t w, std::int64_t dw, std::uintptr_t out,
                        std::int64_t dout, std::uintptr_t stream);

// gy / gw: 0 to skip; otherwise zero-initialised [n_edges, dy] / [n_edges, dw].
void edge_grads(const DeviceDescriptor* d, int dtype, std::int64_t n_edges, std::uintptr_t sender,
                std::uintptr_t receiver, std::uintptr_t x, std::int64_t dx, std::uintptr_t g, std::int64_t dg,
                std::uintptr_t y, std::int64_t dy, std::uintptr_t w, std::int64_t dw, std::uintptr_t gy,
                std::uintptr_t gw, std::uintptr_t stream);

}  // namespace gpu
}  // namespace conv_tp
}  // namespace cfm
