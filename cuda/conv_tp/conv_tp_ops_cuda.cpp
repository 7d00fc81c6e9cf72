// CUDA kernels of the cfm::conv_tp_* operators (conv_tp.cu), bound through the same layer as the
// CPU ones (conv_tp_ops.h). Built with CFM_PLUGINS_CUDA=1 into cfm_plugins/_C_cuda.
#include <type_traits>

#include "conv_tp_cuda.h"
#include "conv_tp_ops.h"

namespace {

namespace gpu = cfm::conv_tp::gpu;
using cfm::conv_tp::Tables;

gpu::DeviceDescriptor device_view(const Tables& t) {
  gpu::DeviceDescriptor d;
  d.n_paths = t.n_paths;
  d.n_pairs = t.n_pairs;
  d.n_ents = t.n_ents;
  d.n_ints = t.n_ints;
  d.ints = t.ints;
  d.coef = t.coef;
  d.max_mul = t.max_mul > 1 ? t.max_mul : 1;
  return d;
}

template <typename T>
constexpr int dtype_code() { return std::is_same_v<T, double> ? 1 : 0; }

template <typename P>
std::uintptr_t u(P* p) { return reinterpret_cast<std::uintptr_t>(p); }

struct CudaRunner {
  template <typename T>
  static void segment(const Tables& t, int64_t n, const int64_t* ptr, const int64_t* perm, const int64_t* other,
                      const T* node_in, int64_t din, const T* y, int64_t dy, const T* w, int64_t dw, T* out,
                      int64_t dout) {
    auto d = device_view(t);
    gpu::segment_accumulate(&d, dtype_code<T>(), n, u(ptr), u(perm), u(other), u(node_in), din, u(y), dy, u(w), dw,
                            u(out), dout, cfm::current_cuda_stream());
  }
  template <typename T>
  static void edge_grads(const Tables& t, int64_t n_edges, const int64_t* sender, const int64_t* receiver,
                         const T* x, int64_t dx, const T* g, int64_t dg, const T* y, int64_t dy, const T* w,
                         int64_t dw, T* gy, T* gw) {
    auto d = device_view(t);
    gpu::edge_grads(&d, dtype_code<T>(), n_edges, u(sender), u(receiver), u(x), dx, u(g), dg, u(y), dy, u(w), dw,
                    u(gy), u(gw), cfm::current_cuda_stream());
  }
};

at::Tensor fwd(const at::Tensor& x, const at::Tensor& y, const at::Tensor& w, at::TensorList graph,
               at::TensorList desc, at::TensorList desc_t, at::IntArrayRef meta) {
  c10::OptionalDeviceGuard guard(x.device());
  return cfm::conv_tp::fwd<CudaRunner>(x, y, w, graph, desc, desc_t, meta);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& g, const at::Tensor& x, const at::Tensor& y,
                                                   const at::Tensor& w, at::TensorList graph, at::TensorList desc,
                                                   at::TensorList desc_t, at::IntArrayRef meta, bool nx, bool ny,
                                                   bool nw) {
  c10::OptionalDeviceGuard guard(x.device());
  return cfm::conv_tp::bwd<CudaRunner>(g, x, y, w, graph, desc, desc_t, meta, nx, ny, nw);
}

}  // namespace

TORCH_LIBRARY_IMPL(cfm, CUDA, m) {
  m.impl("conv_tp_fwd", &fwd);
  m.impl("conv_tp_bwd", &bwd);
}
