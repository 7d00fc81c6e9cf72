// The cfm::silu and cfm::silu_bwd operators: SiLU, f(x) = x sigmoid(x), with a double backward that
// keeps only what it needs.
//
// Why: in force training (forces by autograd with create_graph, then a loss on them) torch
// differentiates SiLU's backward as a chain of elementwise ops (sigmoid, 1 - s, x (1 - s), ...)
// and keeps four of their outputs for the second backward. In MACE's radial MLPs (three SiLU
// layers of [edges, 64] per interaction) those were 1.2 [edges, 1280]-buffers at the train step's
// memory peak (tools/memory_peak.py). Here the first backward is one operator,
// silu_bwd(g, x) = g f'(x), whose own backward keeps (g, x): f'(x) = s (1 + x (1 - s)) and
// f''(x) = s (1 - s) (2 + x (1 - 2 s)) with s = sigmoid(x).
//
// The values are ATen's own silu and silu_backward kernels (CompositeExplicitAutograd: every
// device torch has, Meta for torch.compile), so no device kernel is ours; the backward of silu_bwd
// is written with differentiable ops and silu_bwd again, so every higher derivative exists.
#include "cfm_ops.h"

namespace cfm {
namespace silu {
namespace {

using torch::autograd::Function;

Tensor call_silu(const Tensor& x) {
  static auto op = op_handle("cfm::silu").typed<Tensor(const Tensor&)>();
  return op.call(x);
}

Tensor call_bwd(const Tensor& g, const Tensor& x) {
  static auto op = op_handle("cfm::silu_bwd").typed<Tensor(const Tensor&, const Tensor&)>();
  return op.call(g, x);
}

Tensor silu_kernel(const Tensor& x) { return at::silu(x); }

Tensor silu_bwd_kernel(const Tensor& g, const Tensor& x) { return at::silu_backward(g, x); }

struct BwdFn : Function<BwdFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& g, const Tensor& x) {
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({g, x});
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_bwd(g, x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list res(2);
    const Tensor& a = grads[0];
    if (!a.defined()) return res;
    auto saved = ctx->get_saved_variables();
    const Tensor &g = saved[0], &x = saved[1];
    if (ctx->needs_input_grad(0)) res[0] = call_bwd(a, x);  // d(g f'(x))/dg = f'(x)
    if (ctx->needs_input_grad(1)) {
      const Tensor s = at::sigmoid(x);
      // at::rsub(s, 1, k) = 1 - k s in one kernel (ATen's `1 - s` fills a tensor with 1 first)
      res[1] = a * g * s * at::rsub(s, 1) * (2 + x * at::rsub(s, 1, 2));  // g f''(x)
    }
    return res;
  }
};

struct SiluFn : Function<SiluFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({x});
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_silu(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {Tensor()};
    return {call_bwd(grads[0], ctx->get_saved_variables()[0])};  // through silu_bwd's autograd
  }
};

Tensor silu_autograd(const Tensor& x) { return SiluFn::apply(x); }

Tensor silu_bwd_autograd(const Tensor& g, const Tensor& x) { return BwdFn::apply(g, x); }

}  // namespace
}  // namespace silu
}  // namespace cfm

TORCH_LIBRARY_FRAGMENT(cfm, m) {
  m.def("silu(Tensor x) -> Tensor");
  m.def("silu_bwd(Tensor g, Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(cfm, CompositeExplicitAutograd, m) {
  m.impl("silu", &cfm::silu::silu_kernel);
  m.impl("silu_bwd", &cfm::silu::silu_bwd_kernel);
}

TORCH_LIBRARY_IMPL(cfm, Autograd, m) {
  m.impl("silu", &cfm::silu::silu_autograd);
  m.impl("silu_bwd", &cfm::silu::silu_bwd_autograd);
}
