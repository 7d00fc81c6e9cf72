// Registration of the cfm::conv_tp_* operators: schemas, CPU and Meta kernels, and the autograd
// (backward written with both operators again, the form being trilinear, so every higher
// derivative exists). The CUDA kernels register in conv_tp_ops_cuda.cpp.
#include <algorithm>

#include "conv_tp_host.h"
#include "conv_tp_ops.h"

namespace cfm {
namespace conv_tp {
namespace {

struct CpuRunner {
  template <typename T>
  static void segment(const Tables& t, int64_t n, const int64_t* ptr, const int64_t* perm, const int64_t* other,
                      const T* node_in, int64_t din, const T* y, int64_t dy, const T* w, int64_t dw, T* out,
                      int64_t dout) {
#if defined(CFM_CONV_TP_HAVE_AVX2)
    if (use_avx2())
      return avx2::segment_accumulate<T>(desc_view(t), n, ptr, perm, other, node_in, din, y, dy, w, dw, out, dout,
                                         at::get_num_threads());
#endif
    generic::segment_accumulate<T>(desc_view(t), n, ptr, perm, other, node_in, din, y, dy, w, dw, out, dout,
                                   at::get_num_threads());
  }
  template <typename T>
  static void edge_grads(const Tables& t, int64_t n_edges, const int64_t* sender, const int64_t* receiver,
                         const T* x, int64_t dx, const T* g, int64_t dg, const T* y, int64_t dy, const T* w,
                         int64_t dw, T* gy, T* gw) {
#if defined(CFM_CONV_TP_HAVE_AVX2)
    if (use_avx2())
      return avx2::edge_grads<T>(desc_view(t), n_edges, sender, receiver, x, dx, g, dg, y, dy, w, dw, gy, gw,
                                 at::get_num_threads());
#endif
    generic::edge_grads<T>(desc_view(t), n_edges, sender, receiver, x, dx, g, dg, y, dy, w, dw, gy, gw,
                           at::get_num_threads());
  }
  template <typename T>
  static void segment_radial(const Tables& t, int64_t n, const int64_t* ptr, const int64_t* perm,
                             const int64_t* other, const T* node_in, int64_t din, const T* y, int64_t dy, const T* h,
                             int64_t K, const T* wr, int64_t dw, T* out, int64_t dout) {
#if defined(CFM_CONV_TP_HAVE_AVX2)
    if (use_avx2())
      return avx2::segment_accumulate_radial<T>(desc_view(t), n, ptr, perm, other, node_in, din, y, dy, h, K, wr,
                                                dw, out, dout, at::get_num_threads());
#endif
    generic::segment_accumulate_radial<T>(desc_view(t), n, ptr, perm, other, node_in, din, y, dy, h, K, wr, dw,
                                          out, dout, at::get_num_threads());
  }
  template <typename T>
  static void edge_grads_radial(const Tables& t, int64_t n_edges, const int64_t* sender, const int64_t* receiver,
                                const T* x, int64_t dx, const T* g, int64_t dg, const T* y, int64_t dy, const T* h,
                                int64_t K, const T* wr, int64_t dw, T* gy, T* gh, T* gwr) {
#if defined(CFM_CONV_TP_HAVE_AVX2)
    if (use_avx2())
      return avx2::edge_grads_radial<T>(desc_view(t), n_edges, sender, receiver, x, dx, g, dg, y, dy, h, K, wr, dw,
                                        gy, gh, gwr, at::get_num_threads());
#endif
    generic::edge_grads_radial<T>(desc_view(t), n_edges, sender, receiver, x, dx, g, dg, y, dy, h, K, wr, dw, gy,
                                  gh, gwr, at::get_num_threads());
  }
};

using torch::autograd::Function;
using Vec = std::vector<Tensor>;

Tensor call_fwd(const Tensor& x, const Tensor& y, const Tensor& w, const Vec& graph, const Vec& desc,
                const Vec& desc_t, const std::vector<int64_t>& meta) {
  static auto op = op_handle(kFwd).typed<decltype(fwd<CpuRunner>)>();
  return op.call(x, y, w, graph, desc, desc_t, meta);
}

std::tuple<Tensor, Tensor, Tensor> call_bwd(const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& w,
                                            const Vec& graph, const Vec& desc, const Vec& desc_t,
                                            const std::vector<int64_t>& meta, bool nx, bool ny, bool nw) {
  static auto op = op_handle(kBwd).typed<decltype(bwd<CpuRunner>)>();
  return op.call(g, x, y, w, graph, desc, desc_t, meta, nx, ny, nw);
}

// The static inputs (graph, descriptor) are saved after the differentiable ones.
void save(AutogradContext* ctx, Vec front, const Vec& graph, const Vec& desc, const Vec& desc_t,
          const std::vector<int64_t>& meta) {
  for (const Vec* v : {&graph, &desc, &desc_t}) front.insert(front.end(), v->begin(), v->end());
  ctx->save_for_backward(front);
  ctx->saved_data["meta"] = meta;
}

struct Saved {
  Vec front, graph, desc, desc_t;
  std::vector<int64_t> meta;
};

Saved load(AutogradContext* ctx, size_t n_front) {
  auto s = ctx->get_saved_variables();
  Saved r;
  r.front.assign(s.begin(), s.begin() + n_front);
  r.graph.assign(s.begin() + n_front, s.begin() + n_front + 6);
  r.desc.assign(s.begin() + n_front + 6, s.begin() + n_front + 8);
  r.desc_t.assign(s.begin() + n_front + 8, s.begin() + n_front + 10);
  r.meta = ctx->saved_data["meta"].toIntVector();
  return r;
}

// Sums the terms of one derivative. Every term is a fresh kernel output, so outside a graph (the
// train step's backward) the sum is taken in place: at 4000 atoms a weight-gradient term is an
// [edges, 1280] buffer of 1.6 GB in float32, and a third one would raise the step's peak.
void acc(Tensor& total, const Tensor& term) {
  if (!total.defined()) {
    total = term;
  } else if (!at::GradMode::is_enabled()) {
    total.add_(term);
  } else {
    total = total + term;  // differentiated again (third derivatives): no in-place on the graph
  }
}

// Edges per slice of a weight-gradient term summed in slices (below): an eighth of the edges, and no
// fewer than 32768, so that small graphs, whose step is bound by the host, take no more launches.
int64_t weight_term_slice(int64_t n_edges) { return std::max<int64_t>(32768, (n_edges + 7) / 8); }

// Whether the second weight-gradient term of the double backward is added into ``dw`` slice by slice:
// when the first term is there to add into, the sum is taken in place (no graph to record, see
// acc), the tensors are real (not traced by torch.compile, whose own memory plan this would only
// fill with copies of slices) and the edges are more than one slice.
bool sum_weight_term_in_slices(const Tensor& dw, const Tensor& y) {
  if (!dw.defined() || at::GradMode::is_enabled()) return false;
  const auto traced = c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::Functionalize});
  if (dw.key_set().has_any(traced) || y.key_set().has_any(traced)) return false;
  const auto n_edges = y.sym_size(0).maybe_as_int();  // symbolic under torch.compile: one call
  return n_edges.has_value() && *n_edges > weight_term_slice(*n_edges);
}

// dw += Fw^T(x, y, g), computed for one slice of edges at a time (the weight gradient of an edge needs
// only its sender, receiver and edge attributes): the term never exists as a whole
// [edges, paths*channels] buffer, the size in which force training's peak memory grows.
void add_weight_term_in_slices(Tensor& dw, const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& w,
                               const Saved& s) {
  const int64_t n_edges = y.size(0), step = weight_term_slice(n_edges);
  for (int64_t a = 0; a < n_edges; a += step) {
    const int64_t b = std::min(n_edges, a + step);
    Vec graph = s.graph;
    graph[kSender] = graph[kSender].slice(0, a, b);
    graph[kReceiver] = graph[kReceiver].slice(0, a, b);
    auto term = std::get<2>(call_bwd(g, x, y.slice(0, a, b), w.slice(0, a, b), graph, s.desc, s.desc_t, s.meta,
                                     false, false, true));
    dw.slice(0, a, b).add_(term);
  }
}

struct BwdFn : Function<BwdFn> {
  static variable_list forward(AutogradContext* ctx, const Tensor& g, const Tensor& x, const Tensor& y,
                               const Tensor& w, Vec graph, Vec desc, Vec desc_t, std::vector<int64_t> meta, bool nx,
                               bool ny, bool nw) {
    // Unused outputs (the weight gradient when only forces are differentiated) stay undefined:
    // each zero tensor would cost a full pass below.
    ctx->set_materialize_grads(false);
    save(ctx, {g, x, y, w}, graph, desc, desc_t, meta);
    ctx->saved_data["need"] = c10::List<bool>({nx, ny, nw});
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [gx, gy, gw] = call_bwd(g, x, y, w, graph, desc, desc_t, meta, nx, ny, nw);
    return {gx, gy, gw};
  }

  // With F(x, y, w) the trilinear form, gx = Fx^T(g, y, w), gy = Fy^T(x, g, w), gw = Fw^T(x, y, g);
  // the cotangents (ax, ay, aw) of (gx, gy, gw) give dg = F(ax, y, w) + F(x, ay, w) + F(x, y, aw),
  // dx = Fx^T(g, ay, w) + Fx^T(g, y, aw), dy = Fy^T(ax, g, w) + Fy^T(x, g, aw),
  // dw = Fw^T(ax, y, g) + Fw^T(x, ay, g).
  //
  // Memory: in force training aw is an [edges, paths*channels] buffer (1.6 GB at 4000 atoms in
  // float32), as are w and both terms of dw. The terms of aw are taken first and aw is released
  // (``grads`` is the autograd engine's own list, taken by reference so that dropping it here frees
  // it) before the two dw terms exist, and the second dw term is added into the first slice by slice
  // (add_weight_term_in_slices): two such buffers alive (w and dw), not four.
  static variable_list backward(AutogradContext* ctx, variable_list& grads) {
    Saved s = load(ctx, 4);
    const Tensor &g = s.front[0], &x = s.front[1], &y = s.front[2], &w = s.front[3];
    const bool ng = ctx->needs_input_grad(0), nx = ctx->needs_input_grad(1), ny = ctx->needs_input_grad(2),
               nw = ctx->needs_input_grad(3);
    // an output that was not requested is an empty placeholder: its gradient is ignored
    const auto need = ctx->saved_data["need"].toBoolList();
    const bool hx = need[0] && grads[0].defined(), hy = need[1] && grads[1].defined(),
               hw = need[2] && grads[2].defined();
    Tensor ax = hx ? grads[0].contiguous() : Tensor(), ay = hy ? grads[1].contiguous() : Tensor(),
           aw = hw ? grads[2].contiguous() : Tensor();
    grads.clear();
    Tensor dg, dx, dy, dw;
    if (hw) {
      if (ng) acc(dg, call_fwd(x, y, aw, s.graph, s.desc, s.desc_t, s.meta));
      if (nx || ny) {
        auto [b_x, b_y, b_w] = call_bwd(g, x, y, aw, s.graph, s.desc, s.desc_t, s.meta, nx, ny, false);
        if (nx) acc(dx, b_x);
        if (ny) acc(dy, b_y);
      }
      aw.reset();
    }
    if (ng) {
      if (hx) acc(dg, call_fwd(ax, y, w, s.graph, s.desc, s.desc_t, s.meta));
      if (hy) acc(dg, call_fwd(x, ay, w, s.graph, s.desc, s.desc_t, s.meta));
    }
    if (hx && (ny || nw)) {
      auto [b_x, b_y, b_w] = call_bwd(g, ax, y, w, s.graph, s.desc, s.desc_t, s.meta, false, ny, nw);
      if (ny) acc(dy, b_y);
      if (nw) acc(dw, b_w);
    }
    if (hy && (nx || nw)) {
      const bool sliced = nw && sum_weight_term_in_slices(dw, y), whole_w = nw && !sliced;
      if (nx || whole_w) {  // sliced and no dx wanted: nothing left for a whole-edge call to do
        auto [b_x, b_y, b_w] = call_bwd(g, x, ay, w, s.graph, s.desc, s.desc_t, s.meta, nx, false, whole_w);
        if (nx) acc(dx, b_x);
        if (whole_w) acc(dw, b_w);
      }
      if (sliced) add_weight_term_in_slices(dw, g, x, ay, w, s);
    }
    variable_list res(11);
    res[0] = dg;
    res[1] = dx;
    res[2] = dy;
    res[3] = dw;
    return res;
  }
};

struct FwdFn : Function<FwdFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& y, const Tensor& w, Vec graph, Vec desc,
                        Vec desc_t, std::vector<int64_t> meta) {
    ctx->set_materialize_grads(false);
    save(ctx, {x, y, w}, graph, desc, desc_t, meta);
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_fwd(x, y, w, graph, desc, desc_t, meta);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool nx = ctx->needs_input_grad(0), ny = ctx->needs_input_grad(1), nw = ctx->needs_input_grad(2);
    variable_list res(7);
    if (!grads[0].defined() || !(nx || ny || nw)) return res;
    Saved s = load(ctx, 3);
    auto [gx, gy, gw] = call_bwd(grads[0].contiguous(), s.front[0], s.front[1], s.front[2], s.graph, s.desc,
                                 s.desc_t, s.meta, nx, ny, nw);
    if (nx) res[0] = gx;
    if (ny) res[1] = gy;
    if (nw) res[2] = gw;
    return res;
  }
};

Tensor fwd_autograd(const Tensor& x, const Tensor& y, const Tensor& w, at::TensorList graph, at::TensorList desc,
                    at::TensorList desc_t, at::IntArrayRef meta) {
  return FwdFn::apply(x, y, w, graph.vec(), desc.vec(), desc_t.vec(), meta.vec());
}

std::tuple<Tensor, Tensor, Tensor> bwd_autograd(const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& w,
                                                at::TensorList graph, at::TensorList desc, at::TensorList desc_t,
                                                at::IntArrayRef meta, bool nx, bool ny, bool nw) {
  auto r = BwdFn::apply(g, x, y, w, graph.vec(), desc.vec(), desc_t.vec(), meta.vec(), nx, ny, nw);
  return {r[0], r[1], r[2]};
}

// ---- the radial form's autograd. With T(x, y, w, g) = <g, F(x, y, w)> and w = h @ wr, every
// derivative of (gx, gy, gh, gwr) is again a radial call with a cotangent in one argument's place:
// <ax, gx> = T(ax, y, w, g), <ay, gy> = T(x, ay, w, g), <ah, gh> = T(x, y, ah @ wr, g) and
// <awr, gwr> = T(x, y, h @ awr, g); so every higher derivative exists. ----
Tensor call_radial_fwd(const Tensor& x, const Tensor& y, const Tensor& h, const Tensor& wr, const Vec& graph,
                       const Vec& desc, const Vec& desc_t, const std::vector<int64_t>& meta) {
  static auto op = op_handle(kRadialFwd).typed<decltype(radial_fwd<CpuRunner>)>();
  return op.call(x, y, h, wr, graph, desc, desc_t, meta);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> call_radial_bwd(const Tensor& g, const Tensor& x, const Tensor& y,
                                                           const Tensor& h, const Tensor& wr, const Vec& graph,
                                                           const Vec& desc, const Vec& desc_t,
                                                           const std::vector<int64_t>& meta, bool nx, bool ny,
                                                           bool nh, bool nwr) {
  static auto op = op_handle(kRadialBwd).typed<decltype(radial_bwd<CpuRunner>)>();
  return op.call(g, x, y, h, wr, graph, desc, desc_t, meta, nx, ny, nh, nwr);
}

struct RadialBwdFn : Function<RadialBwdFn> {
  static variable_list forward(AutogradContext* ctx, const Tensor& g, const Tensor& x, const Tensor& y,
                               const Tensor& h, const Tensor& wr, Vec graph, Vec desc, Vec desc_t,
                               std::vector<int64_t> meta, bool nx, bool ny, bool nh, bool nwr) {
    ctx->set_materialize_grads(false);
    save(ctx, {g, x, y, h, wr}, graph, desc, desc_t, meta);
    ctx->saved_data["need"] = c10::List<bool>({nx, ny, nh, nwr});
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [gx, gy, gh, gwr] = call_radial_bwd(g, x, y, h, wr, graph, desc, desc_t, meta, nx, ny, nh, nwr);
    return {gx, gy, gh, gwr};
  }

  static variable_list backward(AutogradContext* ctx, variable_list& grads) {
    Saved s = load(ctx, 5);
    const Tensor &g = s.front[0], &x = s.front[1], &y = s.front[2], &h = s.front[3], &wr = s.front[4];
    const bool ng = ctx->needs_input_grad(0), nx = ctx->needs_input_grad(1), ny = ctx->needs_input_grad(2),
               nh = ctx->needs_input_grad(3), nwr = ctx->needs_input_grad(4);
    const auto need = ctx->saved_data["need"].toBoolList();
    Tensor a[4];
    for (int i = 0; i < 4; ++i)
      if (need[i] && grads[i].defined()) a[i] = grads[i].contiguous();
    grads.clear();
    Tensor dg, dx, dy, dh, dwr;
    // cotangent i takes the place of argument (x, y, h, wr)[i]; that argument's own gradient is not
    // part of the term (the form is linear in it)
    for (int i = 0; i < 4; ++i) {
      if (!a[i].defined()) continue;
      const Tensor& xi = i == 0 ? a[i] : x;
      const Tensor& yi = i == 1 ? a[i] : y;
      const Tensor& hi = i == 2 ? a[i] : h;
      const Tensor& wi = i == 3 ? a[i] : wr;
      if (ng) acc(dg, call_radial_fwd(xi, yi, hi, wi, s.graph, s.desc, s.desc_t, s.meta));
      const bool bx = nx && i != 0, by = ny && i != 1, bh = nh && i != 2, bwr = nwr && i != 3;
      if (bx || by || bh || bwr) {
        auto [b_x, b_y, b_h, b_wr] = call_radial_bwd(g, xi, yi, hi, wi, s.graph, s.desc, s.desc_t, s.meta, bx, by,
                                                      bh, bwr);
        if (bx) acc(dx, b_x);
        if (by) acc(dy, b_y);
        if (bh) acc(dh, b_h);
        if (bwr) acc(dwr, b_wr);
      }
      a[i].reset();
    }
    variable_list res(13);
    res[0] = dg;
    res[1] = dx;
    res[2] = dy;
    res[3] = dh;
    res[4] = dwr;
    return res;
  }
};

struct RadialFwdFn : Function<RadialFwdFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& y, const Tensor& h, const Tensor& wr,
                        Vec graph, Vec desc, Vec desc_t, std::vector<int64_t> meta) {
    ctx->set_materialize_grads(false);
    save(ctx, {x, y, h, wr}, graph, desc, desc_t, meta);
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_radial_fwd(x, y, h, wr, graph, desc, desc_t, meta);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool nx = ctx->needs_input_grad(0), ny = ctx->needs_input_grad(1), nh = ctx->needs_input_grad(2),
               nwr = ctx->needs_input_grad(3);
    variable_list res(8);
    if (!grads[0].defined() || !(nx || ny || nh || nwr)) return res;
    Saved s = load(ctx, 4);
    auto [gx, gy, gh, gwr] = call_radial_bwd(grads[0].contiguous(), s.front[0], s.front[1], s.front[2], s.front[3],
                                              s.graph, s.desc, s.desc_t, s.meta, nx, ny, nh, nwr);
    if (nx) res[0] = gx;
    if (ny) res[1] = gy;
    if (nh) res[2] = gh;
    if (nwr) res[3] = gwr;
    return res;
  }
};

Tensor radial_fwd_autograd(const Tensor& x, const Tensor& y, const Tensor& h, const Tensor& wr, at::TensorList graph,
                           at::TensorList desc, at::TensorList desc_t, at::IntArrayRef meta) {
  return RadialFwdFn::apply(x, y, h, wr, graph.vec(), desc.vec(), desc_t.vec(), meta.vec());
}

std::tuple<Tensor, Tensor, Tensor, Tensor> radial_bwd_autograd(const Tensor& g, const Tensor& x, const Tensor& y,
                                                               const Tensor& h, const Tensor& wr,
                                                               at::TensorList graph, at::TensorList desc,
                                                               at::TensorList desc_t, at::IntArrayRef meta, bool nx,
                                                               bool ny, bool nh, bool nwr) {
  auto r = RadialBwdFn::apply(g, x, y, h, wr, graph.vec(), desc.vec(), desc_t.vec(), meta.vec(), nx, ny, nh, nwr);
  return {r[0], r[1], r[2], r[3]};
}

}  // namespace
}  // namespace conv_tp
}  // namespace cfm

TORCH_LIBRARY_FRAGMENT(cfm, m) {
  m.def(cfm::conv_tp::kSchemaFwd);
  m.def(cfm::conv_tp::kSchemaBwd);
  m.def(cfm::conv_tp::kSchemaRadialFwd);
  m.def(cfm::conv_tp::kSchemaRadialBwd);
}

TORCH_LIBRARY_IMPL(cfm, CPU, m) {
  m.impl("conv_tp_fwd", &cfm::conv_tp::fwd<cfm::conv_tp::CpuRunner>);
  m.impl("conv_tp_bwd", &cfm::conv_tp::bwd<cfm::conv_tp::CpuRunner>);
  m.impl("conv_tp_radial_fwd", &cfm::conv_tp::radial_fwd<cfm::conv_tp::CpuRunner>);
  m.impl("conv_tp_radial_bwd", &cfm::conv_tp::radial_bwd<cfm::conv_tp::CpuRunner>);
}

TORCH_LIBRARY_IMPL(cfm, Meta, m) {
  m.impl("conv_tp_fwd", &cfm::conv_tp::fwd_meta);
  m.impl("conv_tp_bwd", &cfm::conv_tp::bwd_meta);
  m.impl("conv_tp_radial_fwd", &cfm::conv_tp::radial_fwd_meta);
  m.impl("conv_tp_radial_bwd", &cfm::conv_tp::radial_bwd_meta);
}

TORCH_LIBRARY_IMPL(cfm, Autograd, m) {
  m.impl("conv_tp_fwd", &cfm::conv_tp::fwd_autograd);
  m.impl("conv_tp_bwd", &cfm::conv_tp::bwd_autograd);
  m.impl("conv_tp_radial_fwd", &cfm::conv_tp::radial_fwd_autograd);
  m.impl("conv_tp_radial_bwd", &cfm::conv_tp::radial_bwd_autograd);
}
