// CUDA kernels of the cfm::symmetric_contraction_* operators (sc_cuda.cu), bound through the same
// layer as the CPU ones (sc_ops.h). Built with CFM_PLUGINS_CUDA=1 into cfm_plugins/_C_cuda.
#include "sc_cuda_api.h"
#include "sc_ops.h"

namespace {

struct CudaRunner {
  static int threads() { return 1; }
  static void run(int op, bool is_double, const ScArgs& a) { sc_cuda_run(op, is_double, a, cfm::current_cuda_stream()); }
};

// Each wrapper makes the tensors' device current; the kernels run on its current stream.
at::Tensor fwd(const at::Tensor& x, const at::Tensor& coeff, const at::Tensor& elem, const at::Tensor& order,
               const at::Tensor& chunk_ptr, at::TensorList desc, at::IntArrayRef meta) {
  c10::OptionalDeviceGuard guard(x.device());
  return cfm::sc::fwd<CudaRunner>(x, coeff, elem, order, chunk_ptr, desc, meta);
}

std::tuple<at::Tensor, at::Tensor> bwd(const at::Tensor& gout, const at::Tensor& x, const at::Tensor& coeff,
                                       const at::Tensor& elem, const at::Tensor& order, const at::Tensor& chunk_ptr,
                                       at::TensorList desc, at::IntArrayRef meta, bool need_gx, bool need_gc) {
  c10::OptionalDeviceGuard guard(x.device());
  return cfm::sc::bwd<CudaRunner>(gout, x, coeff, elem, order, chunk_ptr, desc, meta, need_gx, need_gc);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd2(const at::Tensor& gout, const at::Tensor& x,
                                                    const at::Tensor& coeff, const std::optional<at::Tensor>& dx,
                                                    const std::optional<at::Tensor>& dcoeff, const at::Tensor& elem,
                                                    const at::Tensor& order, const at::Tensor& chunk_ptr,
                                                    at::TensorList desc, at::IntArrayRef meta, bool need_ggout,
                                                    bool need_gx, bool need_gc) {
  c10::OptionalDeviceGuard guard(x.device());
  return cfm::sc::bwd2<CudaRunner>(gout, x, coeff, dx, dcoeff, elem, order, chunk_ptr, desc, meta, need_ggout,
                                   need_gx, need_gc);
}

}  // namespace

TORCH_LIBRARY_IMPL(cfm, CUDA, m) {
  m.impl("symmetric_contraction_fwd", &fwd);
  m.impl("symmetric_contraction_bwd", &bwd);
  m.impl("symmetric_contraction_bwd2", &bwd2);
}
