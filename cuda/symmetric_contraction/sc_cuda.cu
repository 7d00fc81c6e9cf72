// CUDA kernels of the fused symmetric contraction (forward, backward, double backward).
//
// Same arithmetic as the CPU build: the *_node templates of sc_math.h with W = 1 lane per thread.
// Grid: x = node chunk (all nodes of one element, sorted by element on the host side), y = tile of
// blockDim.x channels; thread = one channel. Per node a thread loads its x row (coalesced over the
// block: consecutive channels are consecutive rows of x[n]), keeps the monomials it needs in
// shared memory (one column per thread, conflict-free) and accumulates the outputs there; the
// element's coefficient rows are read coalesced over channels and stay in L1/L2 across the chunk.
// Coefficient gradients go to global memory with atomicAdd (one element per chunk, so the
// atomics of a block hit one contiguous coefficient slab).
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "sc_cuda_api.h"
#include "sc_math.h"

namespace {

struct AtomicAdd {
  template <typename T>
  CFM_HD void operator()(T* p, T v) const {
#if defined(__CUDA_ARCH__)
    atomicAdd(p, v);
#else
    *p += v;
#endif
  }
};

constexpr int kThreads = 32;  // channels per block (one warp)

template <typename T, int OP>
__global__ void sc_kernel(ScArgs a) {
  const cfm::sc::Desc& d = a.d;
  const std::int64_t k = blockIdx.x;
  const int c = static_cast<int>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= a.C) return;  // no block-level synchronisation below: idle lanes may leave
  if (a.chunk_ptr[k] == a.chunk_ptr[k + 1]) return;  // an empty chunk (a traced forward pads with them)
  extern __shared__ unsigned char smem_raw[];
  T* s = reinterpret_cast<T*>(smem_raw) + threadIdx.x;
  const int ld = blockDim.x;
  const std::int64_t e = a.elem[a.order[a.chunk_ptr[k]]];
  const std::int64_t coff = e * a.R * a.Cp + c;
  const T* x = static_cast<const T*>(a.x);
  const T* coeff = static_cast<const T*>(a.coeff) + coff;
  for (std::int64_t i = a.chunk_ptr[k]; i < a.chunk_ptr[k + 1]; ++i) {
    const std::int64_t n = a.order[i];
    const std::int64_t xoff = (n * a.C + c) * d.L;
    if (OP == 0) {
      cfm::sc::fwd_node<T, 1>(d, x + xoff, 1, coeff, a.Cp, static_cast<T*>(a.out0) + n * d.out_dim, c, s, ld);
    } else if (OP == 1) {
      T* gx = static_cast<T*>(a.out0);
      T* gc = static_cast<T*>(a.out1);
      cfm::sc::bwd_node<T, 1>(d, x + xoff, 1, coeff, a.Cp, static_cast<const T*>(a.gout) + n * d.out_dim, c,
                              gx ? gx + xoff : nullptr, gc ? gc + coff : nullptr, a.Cp, AtomicAdd{}, s, ld);
    } else {
      const T* dx = static_cast<const T*>(a.dx);
      const T* dc = static_cast<const T*>(a.dcoeff);
      T* gg = static_cast<T*>(a.out0);
      T* gx2 = static_cast<T*>(a.out1);
      T* gc2 = static_cast<T*>(a.out2);
      cfm::sc::bwd2_node<T, 1>(d, x + xoff, dx ? dx + xoff : nullptr, 1, coeff, dc ? dc + coff : nullptr, a.Cp,
                               static_cast<const T*>(a.gout) + n * d.out_dim, c,
                               gg ? gg + n * d.out_dim : nullptr, gx2 ? gx2 + xoff : nullptr,
                               gc2 ? gc2 + coff : nullptr, a.Cp, AtomicAdd{}, s, ld);
    }
  }
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string("symmetric_contraction CUDA ") + what + ": " +
                                                   cudaGetErrorString(err));
}

template <typename T, int OP>
void launch(const ScArgs& a, cudaStream_t stream) {
  const int rows = OP == 0 ? cfm::sc::fwd_rows(a.d) : (OP == 1 ? cfm::sc::bwd_rows(a.d) : cfm::sc::bwd2_rows(a.d));
  const std::size_t smem = static_cast<std::size_t>(rows) * kThreads * sizeof(T);
  int dev = 0, limit = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "attribute");
  if (smem > static_cast<std::size_t>(limit))
    throw std::runtime_error("symmetric_contraction CUDA: descriptor needs " + std::to_string(smem) +
                             " bytes of shared memory per block, the device allows " + std::to_string(limit));
  check(cudaFuncSetAttribute(sc_kernel<T, OP>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "cudaFuncSetAttribute");
  if (a.nchunks == 0 || a.C == 0) return;
  dim3 grid(static_cast<unsigned>(a.nchunks), static_cast<unsigned>((a.C + kThreads - 1) / kThreads));
  sc_kernel<T, OP><<<grid, kThreads, smem, stream>>>(a);
  check(cudaGetLastError(), "launch");
}

}  // namespace

void sc_cuda_run(int op, bool is_double, const ScArgs& a, std::uintptr_t stream_int) {
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(stream_int);
  if (is_double) {
    if (op == 0) launch<double, 0>(a, stream);
    else if (op == 1) launch<double, 1>(a, stream);
    else launch<double, 2>(a, stream);
  } else {
    if (op == 0) launch<float, 0>(a, stream);
    else if (op == 1) launch<float, 1>(a, stream);
    else launch<float, 2>(a, stream);
  }
}
