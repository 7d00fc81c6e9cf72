// The cfm::conv_tp_{fwd,bwd} operators: checks, descriptor unpacking, output allocation (the one
// binding layer; CPU and CUDA differ only in their Runner) and Meta kernels.
//
// Descriptor hand-off (cfm_plugins/ops/descriptors/conv_tp.py, ConvTPDescriptor.packed):
//   desc = [ints (int32: path_mul | path_woff | path_pair_start | pair_in | pair_out |
//           pair_ent_start | ent_j), coef (float64: ent_coef)]; desc_t the same for the transpose;
//   meta = [dim_in, dim_out, n_paths, n_pairs, max_mul]
// Graph: [sender, receiver, rperm, rptr, sperm, sptr] (int64; CSR by receiver and by sender).
// x [N, dim_in] channel-last, y [E, dim_edge], w [E, weight_numel]; output [N, dim_out].
#pragma once
#include <algorithm>
#include <tuple>
#include <vector>

#include "cfm_ops.h"
#include "conv_tp_math.h"

namespace cfm {
namespace conv_tp {

constexpr const char* kFwd = "cfm::conv_tp_fwd";
constexpr const char* kBwd = "cfm::conv_tp_bwd";

inline const char* kSchemaFwd =
    "conv_tp_fwd(Tensor x, Tensor y, Tensor w, Tensor[] graph, Tensor[] desc, Tensor[] desc_t, int[] meta) "
    "-> Tensor";
inline const char* kSchemaBwd =
    "conv_tp_bwd(Tensor g, Tensor x, Tensor y, Tensor w, Tensor[] graph, Tensor[] desc, Tensor[] desc_t, "
    "int[] meta, bool need_x, bool need_y, bool need_w) -> (Tensor, Tensor, Tensor)";

constexpr const char* kRadialFwd = "cfm::conv_tp_radial_fwd";
constexpr const char* kRadialBwd = "cfm::conv_tp_radial_bwd";

// The radial form: the weights are w = h @ wr (h [E, K], wr [K, weight_numel]: the last linear
// layer of the radial MLP), made per block of edges inside the kernels and never stored.
// conv_tp_radial_bwd returns (gx, gy, gh, gwr) = d<g, fwd>/d(x, y, h, wr).
inline const char* kSchemaRadialFwd =
    "conv_tp_radial_fwd(Tensor x, Tensor y, Tensor h, Tensor wr, Tensor[] graph, Tensor[] desc, Tensor[] desc_t, "
    "int[] meta) -> Tensor";
inline const char* kSchemaRadialBwd =
    "conv_tp_radial_bwd(Tensor g, Tensor x, Tensor y, Tensor h, Tensor wr, Tensor[] graph, Tensor[] desc, "
    "Tensor[] desc_t, int[] meta, bool need_x, bool need_y, bool need_h, bool need_wr) "
    "-> (Tensor, Tensor, Tensor, Tensor)";

// The descriptor tables as raw pointers (host or device memory, like the tensors).
struct Tables {
  const int* ints;
  const double* coef;
  int n_paths, n_pairs, n_ents, n_ints, max_mul;
};

enum Graph { kSender = 0, kReceiver, kRperm, kRptr, kSperm, kSptr };

inline Tables unpack(const char* op, const Tensor& ref, at::TensorList desc, at::IntArrayRef meta) {
  TORCH_CHECK(desc.size() == 2 && meta.size() == 5, op, ": the descriptor is 2 tensors and 5 ints, got ",
              desc.size(), " and ", meta.size());
  check_index(op, desc[0], "descriptor ints", at::kInt);
  check_index(op, desc[1], "descriptor coefficients", at::kDouble);
  for (const auto& t : desc)
    TORCH_CHECK(t.device() == ref.device(), op, ": descriptor table on ", t.device(), " but the inputs are on ",
                ref.device(), " (move the module with .to())");
  Tables t{desc[0].data_ptr<int>(), desc[1].data_ptr<double>(), static_cast<int>(meta[2]),
           static_cast<int>(meta[3]), static_cast<int>(desc[1].numel()), static_cast<int>(desc[0].numel()),
           static_cast<int>(meta[4])};
  TORCH_CHECK(t.n_ints == 3 * t.n_paths + 1 + 3 * t.n_pairs + 1 + t.n_ents, op, ": inconsistent descriptor sizes");
  return t;
}

inline void check_inputs(const char* op, const Tensor& x, const Tensor& y, const Tensor& w, at::TensorList graph,
                         int64_t dim_in) {
  check_float(op, x, "x");
  check_same(op, x, y, "y");
  check_same(op, x, w, "w");
  TORCH_CHECK(y.is_contiguous() && w.is_contiguous(), op, ": y and w must be contiguous");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == dim_in, op, ": x must be [N, ", dim_in, "], got ", x.sizes());
  TORCH_CHECK(y.dim() == 2 && w.dim() == 2 && y.size(0) == w.size(0), op, ": y and w must be [E, *] alike");
  TORCH_CHECK(graph.size() == 6, op, ": graph is [sender, receiver, rperm, rptr, sperm, sptr]");
  for (const auto& t : graph) {
    check_index(op, t, "a graph index", at::kLong);
    TORCH_CHECK(t.device() == x.device(), op, ": graph index on ", t.device(), ", expected ", x.device());
  }
  TORCH_CHECK(graph[kSender].numel() == y.size(0) && graph[kReceiver].numel() == y.size(0), op,
              ": one sender and receiver per edge expected");
  TORCH_CHECK(graph[kRptr].numel() >= 1 && graph[kSptr].numel() == graph[kRptr].numel(), op, ": bad CSR pointers");
}

// An uninitialised tensor like at::empty; on the CPU, large ones take their memory from a pool of
// freed blocks (conv_tp_pool_cpu.cpp, in the CPU library only: weak, so the CUDA library that
// includes this header needs no such symbol), so a new per-edge gradient does not fault its pages
// in again.
Tensor pooled_empty_cpu(at::IntArrayRef sizes, const at::TensorOptions& options) __attribute__((weak));

inline Tensor pooled_empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (options.device().is_cpu() && &pooled_empty_cpu != nullptr) return pooled_empty_cpu(sizes, options);
  return at::empty(sizes, options);
}

// The tables as the kernels read them (conv_tp_math.h).
inline DescView desc_view(const Tables& t) {
  const int P = t.n_paths, Q = t.n_pairs;
  const int* i = t.ints;
  return DescView{P, Q, t.n_ents, i, i + P, i + 2 * P, i + 3 * P + 1, i + 3 * P + 1 + Q, i + 3 * P + 1 + 2 * Q,
                  i + 3 * P + 2 + 3 * Q, t.coef};
}

template <typename T>
inline const T* cdata(const Tensor& t) { return static_cast<const T*>(t.data_ptr()); }

// ---- device kernels. Runner: segment<T>(Tables, n_nodes, ptr, perm, other, node_in, din, y, dy, w, dw, out,
//      dout) and edge_grads<T>(Tables, n_edges, sender, receiver, x, dx, g, dg, y, dy, w, dw, gy, gw) ----
template <typename Runner>
void segment(const Tables& t, const Tensor& node_in, const Tensor& y, const Tensor& w, const Tensor& ptr,
             const Tensor& perm, const Tensor& other, Tensor& out) {
  const int64_t n = out.size(0);
  AT_DISPATCH_FLOATING_TYPES(node_in.scalar_type(), "cfm::conv_tp segment", [&] {
    Runner::template segment<scalar_t>(t, n, cdata<int64_t>(ptr), cdata<int64_t>(perm), cdata<int64_t>(other),
                                       cdata<scalar_t>(node_in), node_in.size(1), cdata<scalar_t>(y), y.size(1),
                                       cdata<scalar_t>(w), w.size(1), out.data_ptr<scalar_t>(), out.size(1));
  });
}

template <typename Runner>
Tensor fwd(const Tensor& x, const Tensor& y, const Tensor& w, at::TensorList graph, at::TensorList desc,
           at::TensorList desc_t, at::IntArrayRef meta) {
  Tables t = unpack(kFwd, x, desc, meta);
  check_inputs(kFwd, x, y, w, graph, meta[0]);
  // the kernels store every element of their outputs (conv_tp_host.h, conv_tp_cuda.h): no fill
  // where they run; a graph without edges runs none and gets zeros
  const bool runs = y.size(0) > 0;
  Tensor out = runs ? at::empty({graph[kRptr].size(0) - 1, meta[1]}, x.options())
                    : at::zeros({graph[kRptr].size(0) - 1, meta[1]}, x.options());
  if (runs) segment<Runner>(t, x, y, w, graph[kRptr], graph[kRperm], graph[kSender], out);
  return out;
}

template <typename Runner>
std::tuple<Tensor, Tensor, Tensor> bwd(const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& w,
                                       at::TensorList graph, at::TensorList desc, at::TensorList desc_t,
                                       at::IntArrayRef meta, bool need_x, bool need_y, bool need_w) {
  Tables t = unpack(kBwd, x, desc, meta);
  check_inputs(kBwd, x, y, w, graph, meta[0]);
  check_float(kBwd, g, "g");
  check_same(kBwd, x, g, "g");
  TORCH_CHECK(g.dim() == 2 && g.size(0) == graph[kRptr].size(0) - 1 && g.size(1) == meta[1], kBwd,
              ": g must be [N, ", meta[1], "], got ", g.sizes());
  // every element stored by the kernels (see fwd): uninitialised where they run, zeros where not
  const bool runs = y.size(0) > 0;
  Tensor gx = !need_x ? none_like(x)
              : runs  ? at::empty({graph[kSptr].size(0) - 1, meta[0]}, x.options())
                      : at::zeros({graph[kSptr].size(0) - 1, meta[0]}, x.options());
  Tensor gy = need_y ? at::empty_like(y) : none_like(y);  // [E, *]: empty when no edge
  Tensor gw = need_w ? pooled_empty(w.sizes(), w.options()) : none_like(w);
  if (!runs) return {gx, gy, gw};
  if (need_x) {
    std::vector<int64_t> meta_t{meta[1], meta[0], meta[2], meta[3], meta[4]};
    Tables tt = unpack(kBwd, x, desc_t, meta_t);
    segment<Runner>(tt, g, y, w, graph[kSptr], graph[kSperm], graph[kReceiver], gx);
  }
  if (need_y || need_w) {
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cfm::conv_tp edge_grads", [&] {
      Runner::template edge_grads<scalar_t>(
          t, y.size(0), cdata<int64_t>(graph[kSender]), cdata<int64_t>(graph[kReceiver]), cdata<scalar_t>(x),
          x.size(1), cdata<scalar_t>(g), g.size(1), cdata<scalar_t>(y), y.size(1), cdata<scalar_t>(w), w.size(1),
          need_y ? gy.data_ptr<scalar_t>() : nullptr, need_w ? gw.data_ptr<scalar_t>() : nullptr);
    });
  }
  return {gx, gy, gw};
}

// ---- Meta kernels: shapes only (fake tensors of torch.compile / torch.export) ----
inline Tensor fwd_meta(const Tensor& x, const Tensor& y, const Tensor& w, at::TensorList graph, at::TensorList desc,
                       at::TensorList desc_t, at::IntArrayRef meta) {
  return at::empty_symint({graph[kRptr].sym_size(0) - 1, c10::SymInt(meta[1])}, x.options());
}

inline std::tuple<Tensor, Tensor, Tensor> bwd_meta(const Tensor& g, const Tensor& x, const Tensor& y,
                                                   const Tensor& w, at::TensorList graph, at::TensorList desc,
                                                   at::TensorList desc_t, at::IntArrayRef meta, bool need_x,
                                                   bool need_y, bool need_w) {
  auto pick = [](const Tensor& t, bool needed) { return needed ? at::empty_like(t) : at::empty({0}, t.options()); };
  Tensor gx = need_x ? at::empty_symint({graph[kSptr].sym_size(0) - 1, c10::SymInt(meta[0])}, x.options())
                     : at::empty({0}, x.options());
  return {gx, pick(y, need_y), pick(w, need_w)};
}

// ---- the radial form (CPU). Runner: segment_radial<T>(Tables, n_nodes, ptr, perm, other, node_in, din,
//      y, dy, h, K, wr, dw, out, dout) and edge_grads_radial<T>(Tables, n_edges, sender, receiver, x, dx, g,
//      dg, y, dy, h, K, wr, dw, gy, gh, gwr) ----
inline int64_t weight_width(const Tables& t) {  // the weight columns the paths read (host tables)
  const DescView d = desc_view(t);
  int64_t width = 0;
  for (int p = 0; p < d.n_paths; ++p) width = std::max<int64_t>(width, int64_t(d.path_woff[p]) + d.path_mul[p]);
  return width;
}

inline void check_radial(const char* op, const Tables& t, const Tensor& x, const Tensor& y, const Tensor& h,
                         const Tensor& wr, at::TensorList graph, int64_t dim_in) {
  check_inputs(op, x, y, h, graph, dim_in);
  check_same(op, x, wr, "wr");
  TORCH_CHECK(wr.dim() == 2 && wr.is_contiguous() && wr.size(0) == h.size(1), op,
              ": wr must be a contiguous [K, weight_numel] with K = h.size(1) = ", h.size(1), ", got ", wr.sizes());
  TORCH_CHECK(wr.size(1) >= weight_width(t), op, ": wr has ", wr.size(1), " columns, the paths read ",
              weight_width(t));
}

template <typename Runner>
void segment_radial(const Tables& t, const Tensor& node_in, const Tensor& y, const Tensor& h, const Tensor& wr,
                    const Tensor& ptr, const Tensor& perm, const Tensor& other, Tensor& out) {
  AT_DISPATCH_FLOATING_TYPES(node_in.scalar_type(), "cfm::conv_tp_radial segment", [&] {
    Runner::template segment_radial<scalar_t>(
        t, out.size(0), cdata<int64_t>(ptr), cdata<int64_t>(perm), cdata<int64_t>(other), cdata<scalar_t>(node_in),
        node_in.size(1), cdata<scalar_t>(y), y.size(1), cdata<scalar_t>(h), h.size(1), cdata<scalar_t>(wr),
        wr.size(1), out.data_ptr<scalar_t>(), out.size(1));
  });
}

template <typename Runner>
Tensor radial_fwd(const Tensor& x, const Tensor& y, const Tensor& h, const Tensor& wr, at::TensorList graph,
                  at::TensorList desc, at::TensorList desc_t, at::IntArrayRef meta) {
  Tables t = unpack(kRadialFwd, x, desc, meta);
  check_radial(kRadialFwd, t, x, y, h, wr, graph, meta[0]);
  const bool runs = y.size(0) > 0;
  Tensor out = runs ? at::empty({graph[kRptr].size(0) - 1, meta[1]}, x.options())
                    : at::zeros({graph[kRptr].size(0) - 1, meta[1]}, x.options());
  if (runs) segment_radial<Runner>(t, x, y, h, wr, graph[kRptr], graph[kRperm], graph[kSender], out);
  return out;
}

template <typename Runner>
std::tuple<Tensor, Tensor, Tensor, Tensor> radial_bwd(const Tensor& g, const Tensor& x, const Tensor& y,
                                                      const Tensor& h, const Tensor& wr, at::TensorList graph,
                                                      at::TensorList desc, at::TensorList desc_t,
                                                      at::IntArrayRef meta, bool need_x, bool need_y, bool need_h,
                                                      bool need_wr) {
  Tables t = unpack(kRadialBwd, x, desc, meta);
  check_radial(kRadialBwd, t, x, y, h, wr, graph, meta[0]);
  check_float(kRadialBwd, g, "g");
  check_same(kRadialBwd, x, g, "g");
  TORCH_CHECK(g.dim() == 2 && g.size(0) == graph[kRptr].size(0) - 1 && g.size(1) == meta[1], kRadialBwd,
              ": g must be [N, ", meta[1], "], got ", g.sizes());
  const bool runs = y.size(0) > 0;
  Tensor gx = !need_x ? none_like(x)
              : runs  ? at::empty({graph[kSptr].size(0) - 1, meta[0]}, x.options())
                      : at::zeros({graph[kSptr].size(0) - 1, meta[0]}, x.options());
  Tensor gy = need_y ? at::empty_like(y) : none_like(y);
  Tensor gh = need_h ? at::empty_like(h) : none_like(h);
  Tensor gwr = !need_wr ? none_like(wr) : runs ? at::empty_like(wr) : at::zeros_like(wr);
  if (!runs) return {gx, gy, gh, gwr};
  if (need_x) {
    std::vector<int64_t> meta_t{meta[1], meta[0], meta[2], meta[3], meta[4]};
    Tables tt = unpack(kRadialBwd, x, desc_t, meta_t);
    segment_radial<Runner>(tt, g, y, h, wr, graph[kSptr], graph[kSperm], graph[kReceiver], gx);
  }
  if (need_y || need_h || need_wr) {
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cfm::conv_tp_radial edge_grads", [&] {
      Runner::template edge_grads_radial<scalar_t>(
          t, y.size(0), cdata<int64_t>(graph[kSender]), cdata<int64_t>(graph[kReceiver]), cdata<scalar_t>(x),
          x.size(1), cdata<scalar_t>(g), g.size(1), cdata<scalar_t>(y), y.size(1), cdata<scalar_t>(h), h.size(1),
          cdata<scalar_t>(wr), wr.size(1), need_y ? gy.data_ptr<scalar_t>() : nullptr,
          need_h ? gh.data_ptr<scalar_t>() : nullptr, need_wr ? gwr.data_ptr<scalar_t>() : nullptr);
    });
  }
  return {gx, gy, gh, gwr};
}

inline Tensor radial_fwd_meta(const Tensor& x, const Tensor& y, const Tensor& h, const Tensor& wr,
                              at::TensorList graph, at::TensorList desc, at::TensorList desc_t, at::IntArrayRef meta) {
  return at::empty_symint({graph[kRptr].sym_size(0) - 1, c10::SymInt(meta[1])}, x.options());
}

inline std::tuple<Tensor, Tensor, Tensor, Tensor> radial_bwd_meta(const Tensor& g, const Tensor& x, const Tensor& y,
                                                                  const Tensor& h, const Tensor& wr,
                                                                  at::TensorList graph, at::TensorList desc,
                                                                  at::TensorList desc_t, at::IntArrayRef meta,
                                                                  bool need_x, bool need_y, bool need_h,
                                                                  bool need_wr) {
  auto pick = [](const Tensor& t, bool needed) { return needed ? at::empty_like(t) : at::empty({0}, t.options()); };
  Tensor gx = need_x ? at::empty_symint({graph[kSptr].sym_size(0) - 1, c10::SymInt(meta[0])}, x.options())
                     : at::empty({0}, x.options());
  return {gx, pick(y, need_y), pick(h, need_h), pick(wr, need_wr)};
}

}  // namespace conv_tp
}  // namespace cfm
