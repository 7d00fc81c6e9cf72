// Registration of the cfm::skip_tp_* operators: schemas, CPU and Meta kernels, and the autograd.
// The map is bilinear in (x, w), so every derivative is written with the two operators again:
// fwd's backward is bwd, and bwd's backward is fwd twice and bwd once, with the cotangents in the
// places of x and w (every higher derivative exists). The CUDA kernels are the Triton ones
// (cfm_plugins/ops/triton/skip_tp.py), registered from Python.
#include "skip_tp_ops.h"

namespace cfm {
namespace skip_tp {
namespace {

bool use_avx2() {
#if defined(CFM_SKIP_TP_HAVE_AVX2)
  static const bool ok = __builtin_cpu_supports("avx2");
  return ok;
#else
  return false;
#endif
}

struct CpuRunner {
  static void apply(bool dbl, const Tables& t, const Groups& g, const void* src, const void* w, void* dst) {
#if defined(CFM_SKIP_TP_HAVE_AVX2)
    if (use_avx2()) return skip_avx2_apply(dbl, t, g, src, w, dst, at::get_num_threads());
#endif
    skip_generic_apply(dbl, t, g, src, w, dst, at::get_num_threads());
  }
  static void wgrad(bool dbl, const Tables& t, const Groups& g, const void* x, const void* gout, void* gw) {
#if defined(CFM_SKIP_TP_HAVE_AVX2)
    if (use_avx2()) return skip_avx2_wgrad(dbl, t, g, x, gout, gw, at::get_num_threads());
#endif
    skip_generic_wgrad(dbl, t, g, x, gout, gw, at::get_num_threads());
  }
};

using torch::autograd::Function;
using Vec = std::vector<Tensor>;

Tensor call_fwd(const Tensor& x, const Tensor& w, const Tensor& order, const Tensor& elem_ptr, const Vec& desc,
                const Vec& desc_t, const std::vector<int64_t>& meta) {
  static auto op = op_handle(kFwd).typed<decltype(fwd<CpuRunner>)>();
  return op.call(x, w, order, elem_ptr, desc, desc_t, meta);
}

std::tuple<Tensor, Tensor> call_bwd(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& order,
                                    const Tensor& elem_ptr, const Vec& desc, const Vec& desc_t,
                                    const std::vector<int64_t>& meta, bool nx, bool nw) {
  static auto op = op_handle(kBwd).typed<decltype(bwd<CpuRunner>)>();
  return op.call(g, x, w, order, elem_ptr, desc, desc_t, meta, nx, nw);
}

// The static inputs (grouping, descriptor) are saved after the differentiable ones.
void save(AutogradContext* ctx, Vec front, const Tensor& order, const Tensor& elem_ptr, const Vec& desc,
          const Vec& desc_t, const std::vector<int64_t>& meta) {
  front.push_back(order);
  front.push_back(elem_ptr);
  for (const Vec* v : {&desc, &desc_t}) front.insert(front.end(), v->begin(), v->end());
  ctx->save_for_backward(front);
  ctx->saved_data["meta"] = meta;
}

struct Saved {
  Vec front, desc, desc_t;
  Tensor order, elem_ptr;
  std::vector<int64_t> meta;
};

Saved load(AutogradContext* ctx, size_t n_front) {
  auto s = ctx->get_saved_variables();
  Saved r;
  r.front.assign(s.begin(), s.begin() + n_front);
  r.order = s[n_front];
  r.elem_ptr = s[n_front + 1];
  r.desc.assign(s.begin() + n_front + 2, s.begin() + n_front + 4);
  r.desc_t.assign(s.begin() + n_front + 4, s.begin() + n_front + 6);
  r.meta = ctx->saved_data["meta"].toIntVector();
  return r;
}

struct BwdFn : Function<BwdFn> {
  static variable_list forward(AutogradContext* ctx, const Tensor& g, const Tensor& x, const Tensor& w,
                               const Tensor& order, const Tensor& elem_ptr, Vec desc, Vec desc_t,
                               std::vector<int64_t> meta, bool nx, bool nw) {
    ctx->set_materialize_grads(false);  // an unused output's cotangent stays undefined: no wasted pass
    save(ctx, {g, x, w}, order, elem_ptr, desc, desc_t, meta);
    ctx->saved_data["need_x"] = nx;
    ctx->saved_data["need_w"] = nw;
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [gx, gw] = call_bwd(g, x, w, order, elem_ptr, desc, desc_t, meta, nx, nw);
    return {gx, gw};
  }

  // With F(x, w) the bilinear map, gx = Fx^T(g, w) and gw = Fw^T(x, g); the cotangents (ax, aw) of
  // (gx, gw) give dg = F(ax, w) + F(x, aw), dx = Fx^T(g, aw) and dw = Fw^T(ax, g): the last two are
  // one bwd call with (ax, aw) in the places of (x, w).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list res(10);
    // an output that was not requested is an empty placeholder: its cotangent is ignored
    const Tensor ax = ctx->saved_data["need_x"].toBool() && grads[0].defined() ? grads[0].contiguous() : Tensor();
    const Tensor aw = ctx->saved_data["need_w"].toBool() && grads[1].defined() ? grads[1].contiguous() : Tensor();
    const bool ng = ctx->needs_input_grad(0), nx = ctx->needs_input_grad(1) && aw.defined(),
               nw = ctx->needs_input_grad(2) && ax.defined();
    if (!(ax.defined() || aw.defined()) || !(ng || nx || nw)) return res;
    Saved s = load(ctx, 3);
    const Tensor &g = s.front[0], &x = s.front[1], &w = s.front[2];
    if (ng) {
      Tensor dg;
      if (ax.defined()) dg = call_fwd(ax, w, s.order, s.elem_ptr, s.desc, s.desc_t, s.meta);
      if (aw.defined()) {
        Tensor term = call_fwd(x, aw, s.order, s.elem_ptr, s.desc, s.desc_t, s.meta);
        if (!dg.defined())
          dg = term;
        else if (!at::GradMode::is_enabled())
          dg.add_(term);  // fresh kernel outputs: summed in place outside a graph
        else
          dg = dg + term;
      }
      res[0] = dg;
    }
    if (nx || nw) {
      auto [dx, dw] = call_bwd(g, ax.defined() ? ax : x, aw.defined() ? aw : w, s.order, s.elem_ptr, s.desc,
                               s.desc_t, s.meta, nx, nw);
      if (nx) res[1] = dx;
      if (nw) res[2] = dw;
    }
    return res;
  }
};

struct FwdFn : Function<FwdFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& w, const Tensor& order,
                        const Tensor& elem_ptr, Vec desc, Vec desc_t, std::vector<int64_t> meta) {
    ctx->set_materialize_grads(false);
    save(ctx, {x, w}, order, elem_ptr, desc, desc_t, meta);
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_fwd(x, w, order, elem_ptr, desc, desc_t, meta);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool nx = ctx->needs_input_grad(0), nw = ctx->needs_input_grad(1);
    variable_list res(7);
    if (!grads[0].defined() || !(nx || nw)) return res;
    Saved s = load(ctx, 2);
    auto [gx, gw] = call_bwd(grads[0].contiguous(), s.front[0], s.front[1], s.order, s.elem_ptr, s.desc, s.desc_t,
                             s.meta, nx, nw);  // through the autograd: differentiable again
    if (nx) res[0] = gx;
    if (nw) res[1] = gw;
    return res;
  }
};

Tensor fwd_autograd(const Tensor& x, const Tensor& w, const Tensor& order, const Tensor& elem_ptr,
                    at::TensorList desc, at::TensorList desc_t, at::IntArrayRef meta) {
  return FwdFn::apply(x, w, order, elem_ptr, desc.vec(), desc_t.vec(), meta.vec());
}

std::tuple<Tensor, Tensor> bwd_autograd(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& order,
                                        const Tensor& elem_ptr, at::TensorList desc, at::TensorList desc_t,
                                        at::IntArrayRef meta, bool nx, bool nw) {
  auto r = BwdFn::apply(g, x, w, order, elem_ptr, desc.vec(), desc_t.vec(), meta.vec(), nx, nw);
  return {r[0], r[1]};
}

}  // namespace
}  // namespace skip_tp
}  // namespace cfm

TORCH_LIBRARY_FRAGMENT(cfm, m) {
  m.def(cfm::skip_tp::kSchemaFwd);
  m.def(cfm::skip_tp::kSchemaBwd);
}

TORCH_LIBRARY_IMPL(cfm, CPU, m) {
  m.impl("skip_tp_fwd", &cfm::skip_tp::fwd<cfm::skip_tp::CpuRunner>);
  m.impl("skip_tp_bwd", &cfm::skip_tp::bwd<cfm::skip_tp::CpuRunner>);
}

TORCH_LIBRARY_IMPL(cfm, Meta, m) {
  m.impl("skip_tp_fwd", &cfm::skip_tp::fwd_meta);
  m.impl("skip_tp_bwd", &cfm::skip_tp::bwd_meta);
}

TORCH_LIBRARY_IMPL(cfm, Autograd, m) {
  m.impl("skip_tp_fwd", &cfm::skip_tp::fwd_autograd);
  m.impl("skip_tp_bwd", &cfm::skip_tp::bwd_autograd);
}
