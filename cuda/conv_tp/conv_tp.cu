// CUDA kernels of the fused conv TP + scatter. Arithmetic: conv_tp_math.h (shared with the CPU).
//
// segment_kernel: one block per node segment (edges grouped by receiver for the forward, by
//   sender with the transposed tables for the node-feature gradient), channels across threads
//   (coalesced row loads), descriptor tables and the per-edge pair coefficients R in shared
//   memory, the node's output row accumulated in shared memory when it fits (else in its own
//   global row). No atomics, no per-edge message in global memory; deterministic.
// edge_grads_kernel: one block per edge, channels across threads; weight gradient written per
//   (path, channel); edge-attribute gradient from per-thread partials reduced in a fixed order.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "conv_tp_cuda.h"
#include "conv_tp_math.h"

namespace cfm {
namespace conv_tp {
namespace gpu {

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string("conv_tp CUDA ") + what + ": " + cudaGetErrorString(err));
}

struct Tables {  // by value into the kernels
  int n_paths, n_pairs, n_ents, n_ints;
  const int* ints;
  const double* coef;
};

__host__ __device__ inline size_t align8(size_t n) { return (n + 7) & ~size_t(7); }

// Shared memory: coef (double) | R (T, n_pairs) | ints | extra (T)
template <typename T>
__device__ DescView load_tables(const Tables& t, unsigned char* smem, T** R, T** extra) {
  double* coef = reinterpret_cast<double*>(smem);
  size_t off = align8(sizeof(double) * t.n_ents);
  T* r = reinterpret_cast<T*>(smem + off);
  off = align8(off + sizeof(T) * (t.n_pairs > 0 ? t.n_pairs : 1));
  int* ints = reinterpret_cast<int*>(smem + off);
  off = align8(off + sizeof(int) * t.n_ints);
  *extra = reinterpret_cast<T*>(smem + off);
  *R = r;
  for (int i = threadIdx.x; i < t.n_ents; i += blockDim.x) coef[i] = t.coef[i];
  for (int i = threadIdx.x; i < t.n_ints; i += blockDim.x) ints[i] = t.ints[i];
  __syncthreads();
  const int P = t.n_paths, Q = t.n_pairs;
  DescView d;
  d.n_paths = P;
  d.n_pairs = Q;
  d.n_ents = t.n_ents;
  d.path_mul = ints;
  d.path_woff = ints + P;
  d.path_pair_start = ints + 2 * P;
  d.pair_in = ints + 3 * P + 1;
  d.pair_out = ints + 3 * P + 1 + Q;
  d.pair_ent_start = ints + 3 * P + 1 + 2 * Q;
  d.ent_j = ints + 3 * P + 2 + 3 * Q;
  d.ent_coef = coef;
  return d;
}

template <typename T>
size_t table_bytes(const DeviceDescriptor* d) {
  return align8(align8(align8(sizeof(double) * d->n_ents) + sizeof(T) * (d->n_pairs > 0 ? d->n_pairs : 1)) +
                sizeof(int) * d->n_ints);
}

template <typename T, bool SMEM_ACC>
__global__ void segment_kernel(Tables tab, std::int64_t n_nodes, const std::int64_t* __restrict__ ptr,
                               const std::int64_t* __restrict__ perm, const std::int64_t* __restrict__ other,
                               const T* __restrict__ node_in, std::int64_t din, const T* __restrict__ y,
                               std::int64_t dy, const T* __restrict__ w, std::int64_t dw, T* __restrict__ out,
                               std::int64_t dout) {
  extern __shared__ __align__(8) unsigned char smem[];
  T* R;
  T* acc_s;
  const DescView d = load_tables<T>(tab, smem, &R, &acc_s);
  const StridedLanes lanes{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
  for (std::int64_t n = blockIdx.x; n < n_nodes; n += gridDim.x) {
    T* acc = SMEM_ACC ? acc_s : out + n * dout;
    // the row starts at zero (its output was not filled): the first edge's __syncthreads orders
    // this before the sums; a node without edges keeps the zeros
    for (std::int64_t i = threadIdx.x; i < dout; i += blockDim.x) acc[i] = T(0);
    for (std::int64_t k = ptr[n]; k < ptr[n + 1]; ++k) {
      const std::int64_t e = perm[k];
      __syncthreads();  // R of the previous edge consumed (and acc_s zeroed)
      pair_coefs(d, y + e * dy, R, threadIdx.x, blockDim.x);
      __syncthreads();
      message_accumulate(d, R, node_in + other[e] * din, w + e * dw, acc, lanes);
    }
    if (SMEM_ACC) {
      __syncthreads();
      for (std::int64_t i = threadIdx.x; i < dout; i += blockDim.x) out[n * dout + i] = acc_s[i];
      __syncthreads();
    }
  }
}

template <typename T, bool GY, bool GW>
__global__ void edge_grads_kernel(Tables tab, std::int64_t n_edges, const std::int64_t* __restrict__ sender,
                                  const std::int64_t* __restrict__ receiver, const T* __restrict__ x,
                                  std::int64_t dx, const T* __restrict__ g, std::int64_t dg,
                                  const T* __restrict__ y, std::int64_t dy, const T* __restrict__ w,
                                  std::int64_t dw, T* __restrict__ gy, T* __restrict__ gw) {
  extern __shared__ __align__(8) unsigned char smem[];
  T* R;
  T* part;  // [dy][blockDim]: per-thread partial edge-attribute gradients
  const DescView d = load_tables<T>(tab, smem, &R, &part);
  const int tid = threadIdx.x, nt = blockDim.x;
  // each (path, channel) slot of a gw row is stored once (a path without pairs stores zeros), and
  // every gy element: the outputs need no fill where the paths tile the weights (weights_tiled),
  // else the gw row is zeroed first and summed into
  const bool tiled = weights_tiled(d, dw);
  for (std::int64_t e = blockIdx.x; e < n_edges; e += gridDim.x) {
    __syncthreads();
    if (GW) pair_coefs(d, y + e * dy, R, tid, nt);
    if (GY) for (int j = 0; j < dy; ++j) part[j * nt + tid] = T(0);
    if (GW && !tiled)
      for (std::int64_t i = tid; i < dw; i += nt) gw[e * dw + i] = T(0);
    __syncthreads();
    const T* xr = x + sender[e] * dx;
    const T* gr = g + receiver[e] * dg;
    const T* wr = w + e * dw;
    for (int p = 0; p < d.n_paths; ++p) {
      const int C = d.path_mul[p];
      const int woff = d.path_woff[p];
      for (int c = tid; c < C; c += nt) {
        T accw = T(0);
        for (int q = d.path_pair_start[p]; q < d.path_pair_start[p + 1]; ++q) {
          const T xi = xr[d.pair_in[q] + c], gk = gr[d.pair_out[q] + c];
          if (GW) accw += weight_grad_term(R[q], xi, gk);
          if (GY) {
            const T v = edge_attr_grad_term(xi, gk, wr[woff + c]);
            for (int t = d.pair_ent_start[q]; t < d.pair_ent_start[q + 1]; ++t)
              part[d.ent_j[t] * nt + tid] += T(d.ent_coef[t]) * v;
          }
        }
        if (GW) {
          if (tiled)
            gw[e * dw + woff + c] = accw;
          else
            gw[e * dw + woff + c] += accw;
        }
      }
    }
    if (GY) {
      __syncthreads();
      for (int j = tid; j < dy; j += nt) {
        T s = T(0);
        for (int t = 0; t < nt; ++t) s += part[j * nt + t];
        gy[e * dy + j] = s;
      }
    }
  }
}

int block_threads(const DeviceDescriptor* d) {
  int t = ((d->max_mul + 31) / 32) * 32;
  return t < 32 ? 32 : (t > 256 ? 256 : t);
}

Tables tables(const DeviceDescriptor* d) { return Tables{d->n_paths, d->n_pairs, d->n_ents, d->n_ints, d->ints, d->coef}; }

int grid_for(std::int64_t n) {
  const std::int64_t cap = std::int64_t(1) << 20;
  return static_cast<int>(n < 1 ? 1 : (n > cap ? cap : n));
}

constexpr size_t kSmemDefault = 48 * 1024;

template <typename T>
void launch_segment(const DeviceDescriptor* d, std::int64_t n_nodes, std::uintptr_t ptr, std::uintptr_t perm,
                    std::uintptr_t other, std::uintptr_t node_in, std::int64_t din, std::uintptr_t y, std::int64_t dy,
                    std::uintptr_t w, std::int64_t dw, std::uintptr_t out, std::int64_t dout, cudaStream_t stream) {
  if (n_nodes <= 0) return;
  const int threads = block_threads(d);
  const size_t base = table_bytes<T>(d);
  const size_t with_acc = base + sizeof(T) * static_cast<size_t>(dout);
  auto args = [&](auto kernel, size_t smem) {
    kernel<<<grid_for(n_nodes), threads, smem, stream>>>(
        tables(d), n_nodes, reinterpret_cast<const std::int64_t*>(ptr), reinterpret_cast<const std::int64_t*>(perm),
        reinterpret_cast<const std::int64_t*>(other), reinterpret_cast<const T*>(node_in), din,
        reinterpret_cast<const T*>(y), dy, reinterpret_cast<const T*>(w), dw, reinterpret_cast<T*>(out), dout);
  };
  if (with_acc <= kSmemDefault)
    args(segment_kernel<T, true>, with_acc);
  else
    args(segment_kernel<T, false>, base);
  check(cudaGetLastError(), "segment_kernel launch");
}

template <typename T>
void launch_edge_grads(const DeviceDescriptor* d, std::int64_t n_edges, std::uintptr_t sender, std::uintptr_t receiver,
                       std::uintptr_t x, std::int64_t dx, std::uintptr_t g, std::int64_t dg, std::uintptr_t y,
                       std::int64_t dy, std::uintptr_t w, std::int64_t dw, std::uintptr_t gy, std::uintptr_t gw,
                       cudaStream_t stream) {
  if (n_edges <= 0 || (!gy && !gw)) return;
  const int threads = block_threads(d);
  const size_t smem = table_bytes<T>(d) + (gy ? sizeof(T) * static_cast<size_t>(dy) * threads : 0);
  if (smem > kSmemDefault) throw std::runtime_error("conv_tp CUDA: descriptor too large for shared memory");
  auto run = [&](auto kernel) {
    kernel<<<grid_for(n_edges), threads, smem, stream>>>(
        tables(d), n_edges, reinterpret_cast<const std::int64_t*>(sender),
        reinterpret_cast<const std::int64_t*>(receiver), reinterpret_cast<const T*>(x), dx,
        reinterpret_cast<const T*>(g), dg, reinterpret_cast<const T*>(y), dy, reinterpret_cast<const T*>(w), dw,
        reinterpret_cast<T*>(gy), reinterpret_cast<T*>(gw));
  };
  if (gy && gw)
    run(edge_grads_kernel<T, true, true>);
  else if (gy)
    run(edge_grads_kernel<T, true, false>);
  else
    run(edge_grads_kernel<T, false, true>);
  check(cudaGetLastError(), "edge_grads_kernel launch");
}

}  // namespace

void segment_accumulate(const DeviceDescriptor* d, int dtype, std::int64_t n_nodes, std::uintptr_t ptr,
                        std::uintptr_t perm, std::uintptr_t other, std::uintptr_t node_in, std::int64_t din,
                        std::uintptr_t y, std::int64_t dy, std::uintptr_t w, std::int64_t dw, std::uintptr_t out,
                        std::int64_t dout, std::uintptr_t stream) {
  auto s = reinterpret_cast<cudaStream_t>(stream);
  if (dtype == 0)
    launch_segment<float>(d, n_nodes, ptr, perm, other, node_in, din, y, dy, w, dw, out, dout, s);
  else if (dtype == 1)
    launch_segment<double>(d, n_nodes, ptr, perm, other, node_in, din, y, dy, w, dw, out, dout, s);
  else
    throw std::invalid_argument("conv_tp: dtype code must be 0 (float32) or 1 (float64)");
}

void edge_grads(const DeviceDescriptor* d, int dtype, std::int64_t n_edges, std::uintptr_t sender,
                std::uintptr_t receiver, std::uintptr_t x, std::int64_t dx, std::uintptr_t g, std::int64_t dg,
                std::uintptr_t y, std::int64_t dy, std::uintptr_t w, std::int64_t dw, std::uintptr_t gy,
                std::uintptr_t gw, std::uintptr_t stream) {
  auto s = reinterpret_cast<cudaStream_t>(stream);
  if (dtype == 0)
    launch_edge_grads<float>(d, n_edges, sender, receiver, x, dx, g, dg, y, dy, w, dw, gy, gw, s);
  else if (dtype == 1)
    launch_edge_grads<double>(d, n_edges, sender, receiver, x, dx, g, dg, y, dy, w, dw, gy, gw, s);
  else
    throw std::invalid_argument("conv_tp: dtype code must be 0 (float32) or 1 (float64)");
}

}  // namespace gpu
}  // namespace conv_tp
}  // namespace cfm
