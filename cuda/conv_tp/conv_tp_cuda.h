// CUDA entry points of the fused conv TP (implemented in conv_tp.cu, registered as the CUDA
// kernels of the cfm::conv_tp_* torch operators in conv_tp_ops_cuda.cpp). No torch here: raw
// device pointers, sizes, and the CUDA stream as an integer (nvcc never sees torch headers).
#pragma once
#include <cstdint>
#include <vector>

namespace cfm {
namespace conv_tp {
namespace gpu {

// The descriptor tables in device memory (module buffers, see descriptors/conv_tp.py), not owned.
struct DeviceDescriptor {
  int n_paths = 0, n_pairs = 0, n_ents = 0, n_ints = 0;
  const int* ints = nullptr;     // path_mul | path_woff | path_pair_start | pair_in | pair_out | pair_ent_start | ent_j
  const double* coef = nullptr;  // ent_coef
  int max_mul = 1;
};

// dtype: 0 float32, 1 float64. Every row n < n_nodes of `out` is written (zeroed in the kernel, then
// summed): `out` may be uninitialised.
void segment_accumulate(const DeviceDescriptor* d, int dtype, std::int64_t n_nodes, std::uintptr_t ptr,
                        std::uintptr_t perm, std::uintptr_t other, std::uintptr_t node_in, std::int64_t din,
                        std::uintptr_t y, std::int64_t dy, std::uintptr_t w, std::int64_t dw, std::uintptr_t out,
                        std::int64_t dout, std::uintptr_t stream);

// gy / gw: 0 to skip; otherwise [n_edges, dy] / [n_edges, dw], every element written (gw zeroed per
// edge in the kernel where the paths do not tile the weights): they may be uninitialised.
void edge_grads(const DeviceDescriptor* d, int dtype, std::int64_t n_edges, std::uintptr_t sender,
                std::uintptr_t receiver, std::uintptr_t x, std::int64_t dx, std::uintptr_t g, std::int64_t dg,
                std::uintptr_t y, std::int64_t dy, std::uintptr_t w, std::int64_t dw, std::uintptr_t gy,
                std::uintptr_t gw, std::uintptr_t stream);

}  // namespace gpu
}  // namespace conv_tp
}  // namespace cfm
