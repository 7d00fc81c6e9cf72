// Registration of the cfm::symmetric_contraction_* operators: schemas, CPU and Meta kernels, and
// the autograd that makes a scripted / exported model differentiable without Python. The CUDA
// kernels register in sc_ops_cuda.cpp (built only with CFM_PLUGINS_CUDA=1).
#include "sc_ops.h"

namespace cfm {
namespace sc {
namespace {

bool use_avx2() {
#if defined(CFM_SC_HAVE_AVX2)
  static const bool ok = __builtin_cpu_supports("avx2");
  return ok;
#else
  return false;
#endif
}

struct CpuRunner : cfm::CpuRunner {
  static void run(int op, bool is_double, const ScArgs& a) {
#if defined(CFM_SC_HAVE_AVX2)
    if (use_avx2()) {
      sc_avx2_run(op, is_double, a);
      return;
    }
#endif
    sc_generic_run(op, is_double, a);
  }
};

using torch::autograd::Function;

// bwd2 is the last derivative: its backward raises instead of returning wrong zeros.
struct Bwd2Fn : Function<Bwd2Fn> {
  static variable_list forward(AutogradContext* ctx, const Tensor& gout, const Tensor& x, const Tensor& coeff,
                               const std::optional<Tensor>& dx, const std::optional<Tensor>& dcoeff,
                               const Tensor& elem, const Tensor& order, const Tensor& chunk_ptr,
                               std::vector<Tensor> desc, std::vector<int64_t> meta, bool need_ggout, bool need_gx,
                               bool need_gc) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle(kBwd2).typed<decltype(bwd2<CpuRunner>)>();
    auto [a, b, c] = op.call(gout, x, coeff, dx, dcoeff, elem, order, chunk_ptr, desc, meta, need_ggout, need_gx,
                             need_gc);
    return {a, b, c};
  }
  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK(false, "FusedSymmetricContraction: third derivatives are not implemented");
  }
};

struct BwdFn : Function<BwdFn> {
  static variable_list forward(AutogradContext* ctx, const Tensor& gout, const Tensor& x, const Tensor& coeff,
                               const Tensor& elem, const Tensor& order, const Tensor& chunk_ptr,
                               std::vector<Tensor> desc, std::vector<int64_t> meta, bool need_gx, bool need_gc) {
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined: no wasted pass
    std::vector<Tensor> saved{gout, x, coeff, elem, order, chunk_ptr};
    saved.insert(saved.end(), desc.begin(), desc.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["meta"] = meta;
    ctx->saved_data["need_gx"] = need_gx;
    ctx->saved_data["need_gc"] = need_gc;
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle(kBwd).typed<decltype(bwd<CpuRunner>)>();
    auto [gx, gc] = op.call(gout, x, coeff, elem, order, chunk_ptr, desc, meta, need_gx, need_gc);
    return {gx, gc};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const bool need_gx = ctx->saved_data["need_gx"].toBool(), need_gc = ctx->saved_data["need_gc"].toBool();
    // an output that was not requested is an empty placeholder: its gradient is ignored
    Tensor dx = (need_gx && grads[0].defined()) ? grads[0].contiguous() : Tensor();
    Tensor dc = (need_gc && grads[1].defined()) ? grads[1].contiguous() : Tensor();
    const bool w0 = ctx->needs_input_grad(0), w1 = ctx->needs_input_grad(1), w2 = ctx->needs_input_grad(2);
    variable_list res(10);
    if ((!dx.defined() && !dc.defined()) || !(w0 || w1 || w2)) return res;
    std::vector<Tensor> desc(s.begin() + 6, s.end());
    auto meta = ctx->saved_data["meta"].toIntVector();
    static auto op = op_handle(kBwd2).typed<decltype(bwd2<CpuRunner>)>();
    auto [ggout, gx2, gc2] = op.call(s[0], s[1], s[2], dx.defined() ? std::optional<Tensor>(dx) : std::nullopt,
                                     dc.defined() ? std::optional<Tensor>(dc) : std::nullopt, s[3], s[4], s[5], desc,
                                     meta, w0, w1, w2);
    if (w0) res[0] = ggout;
    if (w1) res[1] = gx2;
    if (w2) res[2] = gc2;
    return res;
  }
};

struct FwdFn : Function<FwdFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& coeff, const Tensor& elem,
                        const Tensor& order, const Tensor& chunk_ptr, std::vector<Tensor> desc,
                        std::vector<int64_t> meta) {
    std::vector<Tensor> saved{x, coeff, elem, order, chunk_ptr};
    saved.insert(saved.end(), desc.begin(), desc.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["meta"] = meta;
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle(kFwd).typed<decltype(fwd<CpuRunner>)>();
    return op.call(x, coeff, elem, order, chunk_ptr, desc, meta);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool need_gx = ctx->needs_input_grad(0), need_gc = ctx->needs_input_grad(1);
    variable_list res(7);
    if (!(need_gx || need_gc) || !grads[0].defined()) return res;
    auto s = ctx->get_saved_variables();
    std::vector<Tensor> desc(s.begin() + 5, s.end());
    auto meta = ctx->saved_data["meta"].toIntVector();
    static auto op = op_handle(kBwd).typed<decltype(bwd<CpuRunner>)>();  // through autograd: differentiable
    auto [gx, gc] = op.call(grads[0].contiguous(), s[0], s[1], s[2], s[3], s[4], desc, meta, need_gx, need_gc);
    if (need_gx) res[0] = gx;
    if (need_gc) res[1] = gc;
    return res;
  }
};

Tensor fwd_autograd(const Tensor& x, const Tensor& coeff, const Tensor& elem, const Tensor& order,
                    const Tensor& chunk_ptr, at::TensorList desc, at::IntArrayRef meta) {
  return FwdFn::apply(x, coeff, elem, order, chunk_ptr, desc.vec(), meta.vec());
}

std::tuple<Tensor, Tensor> bwd_autograd(const Tensor& gout, const Tensor& x, const Tensor& coeff, const Tensor& elem,
                                        const Tensor& order, const Tensor& chunk_ptr, at::TensorList desc,
                                        at::IntArrayRef meta, bool need_gx, bool need_gc) {
  auto r = BwdFn::apply(gout, x, coeff, elem, order, chunk_ptr, desc.vec(), meta.vec(), need_gx, need_gc);
  return {r[0], r[1]};
}

std::tuple<Tensor, Tensor, Tensor> bwd2_autograd(const Tensor& gout, const Tensor& x, const Tensor& coeff,
                                                 const std::optional<Tensor>& dx, const std::optional<Tensor>& dcoeff,
                                                 const Tensor& elem, const Tensor& order, const Tensor& chunk_ptr,
                                                 at::TensorList desc, at::IntArrayRef meta, bool need_ggout,
                                                 bool need_gx, bool need_gc) {
  auto r = Bwd2Fn::apply(gout, x, coeff, dx, dcoeff, elem, order, chunk_ptr, desc.vec(), meta.vec(), need_ggout,
                         need_gx, need_gc);
  return {r[0], r[1], r[2]};
}

}  // namespace
}  // namespace sc
}  // namespace cfm

TORCH_LIBRARY_FRAGMENT(cfm, m) {
  m.def(cfm::sc::kSchemaFwd);
  m.def(cfm::sc::kSchemaBwd);
  m.def(cfm::sc::kSchemaBwd2);
}

TORCH_LIBRARY_IMPL(cfm, CPU, m) {
  using R = cfm::sc::CpuRunner;
  m.impl("symmetric_contraction_fwd", &cfm::sc::fwd<R>);
  m.impl("symmetric_contraction_bwd", &cfm::sc::bwd<R>);
  m.impl("symmetric_contraction_bwd2", &cfm::sc::bwd2<R>);
}

TORCH_LIBRARY_IMPL(cfm, Meta, m) {
  m.impl("symmetric_contraction_fwd", &cfm::sc::fwd_meta);
  m.impl("symmetric_contraction_bwd", &cfm::sc::bwd_meta);
  m.impl("symmetric_contraction_bwd2", &cfm::sc::bwd2_meta);
}

TORCH_LIBRARY_IMPL(cfm, Autograd, m) {
  m.impl("symmetric_contraction_fwd", &cfm::sc::fwd_autograd);
  m.impl("symmetric_contraction_bwd", &cfm::sc::bwd_autograd);
  m.impl("symmetric_contraction_bwd2", &cfm::sc::bwd2_autograd);
}
