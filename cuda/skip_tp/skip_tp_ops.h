// The cfm::skip_tp_{fwd,bwd} operators: checks, descriptor unpacking, output allocation (the one
// binding layer) and Meta kernels.
//
// Descriptor hand-off (cfm_plugins/ops/descriptors/skip_tp.py, SkipTPDescriptor.packed):
//   desc = [ints (int32: blocks (dst_off, dst_mul, dim) | path_ptr | paths (src_off, K, woff,
//           k_stride, n_stride, e_stride)), coef (float64, one per path)] for the forward
//           (destination: the output), desc_t the same for the node-feature gradient;
//   meta = [dim_in, dim_out, num_elements, weight_numel, n_paths, n_blocks, n_blocks_t].
// Per call: x [N, dim_in], w [weight_numel] (e3nn's flat weights), order [N] (nodes sorted by
// element), elem_ptr [E + 1] (int64: the nodes of element e are order[elem_ptr[e]:elem_ptr[e+1]]).
#pragma once
#include <tuple>
#include <vector>

#include "cfm_ops.h"
#include "skip_tp_cpu_api.h"

namespace cfm {
namespace skip_tp {

constexpr const char* kFwd = "cfm::skip_tp_fwd";
constexpr const char* kBwd = "cfm::skip_tp_bwd";

inline const char* kSchemaFwd =
    "skip_tp_fwd(Tensor x, Tensor w, Tensor order, Tensor elem_ptr, Tensor[] desc, Tensor[] desc_t, int[] meta) "
    "-> Tensor";
inline const char* kSchemaBwd =
    "skip_tp_bwd(Tensor g, Tensor x, Tensor w, Tensor order, Tensor elem_ptr, Tensor[] desc, Tensor[] desc_t, "
    "int[] meta, bool need_x, bool need_w) -> (Tensor, Tensor)";

enum Meta { kDimIn = 0, kDimOut, kElements, kWeights, kPaths, kBlocks, kBlocksT };

// The tables of one orientation as raw pointers; their offsets checked against the sizes (host
// memory: the CPU kernels; the CUDA kernels are Triton's, which read the same tensors).
inline Tables unpack(const char* op, const Tensor& ref, at::TensorList desc, at::IntArrayRef meta, bool transposed) {
  TORCH_CHECK(meta.size() == 7, op, ": meta is 7 ints, got ", meta.size());
  TORCH_CHECK(desc.size() == 2, op, ": the descriptor is 2 tensors, got ", desc.size());
  check_index(op, desc[0], "descriptor ints", at::kInt);
  check_index(op, desc[1], "descriptor coefficients", at::kDouble);
  for (const auto& t : desc)
    TORCH_CHECK(t.device() == ref.device(), op, ": descriptor table on ", t.device(), " but the inputs are on ",
                ref.device(), " (move the module with .to())");
  Tables t;
  t.n_paths = static_cast<int>(meta[kPaths]);
  t.n_blocks = static_cast<int>(transposed ? meta[kBlocksT] : meta[kBlocks]);
  t.dim_src = transposed ? meta[kDimOut] : meta[kDimIn];
  t.dim_dst = transposed ? meta[kDimIn] : meta[kDimOut];
  t.num_elements = meta[kElements];
  t.weight_numel = meta[kWeights];
  TORCH_CHECK(desc[0].numel() == 4 * std::int64_t(t.n_blocks) + 1 + 6 * std::int64_t(t.n_paths) &&
                  desc[1].numel() == t.n_paths,
              op, ": inconsistent descriptor sizes");
  const std::int32_t* ints = desc[0].data_ptr<std::int32_t>();
  t.blocks = ints;
  t.path_ptr = ints + 3 * t.n_blocks;
  t.paths = t.path_ptr + t.n_blocks + 1;
  t.coef = desc[1].data_ptr<double>();
  if (ref.is_cpu()) {  // the tables are read on the host: check every offset once
    TORCH_CHECK(t.path_ptr[0] == 0 && t.path_ptr[t.n_blocks] == t.n_paths, op, ": bad path pointers");
    for (int b = 0; b < t.n_blocks; ++b) {
      const std::int32_t* bl = t.blocks + 3 * b;
      const std::int64_t end = std::int64_t(bl[0]) + std::int64_t(bl[1]) * bl[2];
      TORCH_CHECK(bl[0] >= 0 && bl[1] >= 0 && bl[2] >= 1 && end <= t.dim_dst && t.path_ptr[b] <= t.path_ptr[b + 1],
                  op, ": destination block ", b, " out of range");
      for (int p = t.path_ptr[b]; p < t.path_ptr[b + 1]; ++p) {
        const std::int32_t* ph = t.paths + 6 * p;
        const std::int64_t K = ph[1], last = std::int64_t(ph[2]) + (K - 1) * ph[3] + (t.num_elements - 1) * ph[5] +
                                                 std::int64_t(bl[1] - 1) * ph[4];
        TORCH_CHECK(ph[0] >= 0 && K >= 1 && std::int64_t(ph[0]) + K * bl[2] <= t.dim_src && ph[2] >= 0 &&
                        last < t.weight_numel,
                    op, ": path ", p, " out of range");
      }
    }
  }
  return t;
}

inline Groups check_inputs(const char* op, const Tensor& x, const Tensor& w, const Tensor& order,
                           const Tensor& elem_ptr, at::IntArrayRef meta) {
  check_float(op, x, "x");
  check_same(op, x, w, "w");
  TORCH_CHECK(w.is_contiguous() && w.dim() == 1 && w.size(0) == meta[kWeights], op, ": w must be contiguous [",
              meta[kWeights], "], got ", w.sizes());
  TORCH_CHECK(x.dim() == 2 && x.size(1) == meta[kDimIn], op, ": x must be [N, ", meta[kDimIn], "], got ", x.sizes());
  check_index(op, order, "order", at::kLong);
  check_index(op, elem_ptr, "elem_ptr", at::kLong);
  TORCH_CHECK(order.device() == x.device() && elem_ptr.device() == x.device(), op,
              ": order and elem_ptr must be on ", x.device());
  TORCH_CHECK(order.dim() == 1 && order.size(0) == x.size(0), op, ": order must be [", x.size(0), "], got ",
              order.sizes());
  TORCH_CHECK(elem_ptr.dim() == 1 && elem_ptr.size(0) == meta[kElements] + 1, op, ": elem_ptr must be [",
              meta[kElements] + 1, "], got ", elem_ptr.sizes());
  Groups g;
  g.n_nodes = x.size(0);
  g.order = order.data_ptr<std::int64_t>();
  g.elem_ptr = elem_ptr.data_ptr<std::int64_t>();
  if (x.is_cpu()) {  // O(N + E) on the host: a bad grouping would leave rows unwritten
    TORCH_CHECK(g.elem_ptr[0] == 0 && g.elem_ptr[meta[kElements]] == g.n_nodes, op,
                ": elem_ptr must run from 0 to the number of nodes");
    for (std::int64_t e = 0; e < meta[kElements]; ++e)
      TORCH_CHECK(g.elem_ptr[e] <= g.elem_ptr[e + 1], op, ": elem_ptr must not decrease");
    for (std::int64_t i = 0; i < g.n_nodes; ++i)
      TORCH_CHECK(g.order[i] >= 0 && g.order[i] < g.n_nodes, op, ": order holds ", g.order[i], ", not a node");
  }
  return g;
}

// ---- the operators (Runner: apply(is_double, Tables, Groups, src, w, dst) and wgrad(is_double,
//      Tables, Groups, x, g, gw), each writing every element of its output) ----
template <typename Runner>
Tensor fwd(const Tensor& x, const Tensor& w, const Tensor& order, const Tensor& elem_ptr, at::TensorList desc,
           at::TensorList desc_t, at::IntArrayRef meta) {
  Tables t = unpack(kFwd, x, desc, meta, false);
  Groups g = check_inputs(kFwd, x, w, order, elem_ptr, meta);
  Tensor out = at::empty({x.size(0), meta[kDimOut]}, x.options());
  if (x.size(0) > 0) Runner::apply(x.scalar_type() == at::kDouble, t, g, x.data_ptr(), w.data_ptr(), out.data_ptr());
  return out;
}

template <typename Runner>
std::tuple<Tensor, Tensor> bwd(const Tensor& gout, const Tensor& x, const Tensor& w, const Tensor& order,
                               const Tensor& elem_ptr, at::TensorList desc, at::TensorList desc_t,
                               at::IntArrayRef meta, bool need_x, bool need_w) {
  Groups g = check_inputs(kBwd, x, w, order, elem_ptr, meta);
  check_float(kBwd, gout, "g");
  check_same(kBwd, x, gout, "g");
  TORCH_CHECK(gout.dim() == 2 && gout.size(0) == x.size(0) && gout.size(1) == meta[kDimOut], kBwd, ": g must be [",
              x.size(0), ", ", meta[kDimOut], "], got ", gout.sizes());
  const bool dbl = x.scalar_type() == at::kDouble;
  Tensor gx = need_x ? at::empty_like(x) : none_like(x);
  Tensor gw = need_w ? at::empty_like(w) : none_like(w);
  if (need_x && x.size(0) > 0) {
    Tables tt = unpack(kBwd, x, desc_t, meta, true);
    Runner::apply(dbl, tt, g, gout.data_ptr(), w.data_ptr(), gx.data_ptr());
  }
  if (need_w) {  // also without nodes: every element's gradient is written (zeros)
    Tables t = unpack(kBwd, x, desc, meta, false);
    Runner::wgrad(dbl, t, g, x.data_ptr(), gout.data_ptr(), gw.data_ptr());
  }
  return {gx, gw};
}

// ---- Meta kernels: shapes only (fake tensors of torch.compile / torch.export) ----
inline Tensor fwd_meta(const Tensor& x, const Tensor& w, const Tensor& order, const Tensor& elem_ptr,
                       at::TensorList desc, at::TensorList desc_t, at::IntArrayRef meta) {
  return at::empty_symint({x.sym_size(0), c10::SymInt(meta[kDimOut])}, x.options());
}

inline std::tuple<Tensor, Tensor> bwd_meta(const Tensor& gout, const Tensor& x, const Tensor& w, const Tensor& order,
                                           const Tensor& elem_ptr, at::TensorList desc, at::TensorList desc_t,
                                           at::IntArrayRef meta, bool need_x, bool need_w) {
  return {need_x ? at::empty_like(x) : at::empty({0}, x.options()),
          need_w ? at::empty_like(w) : at::empty({0}, w.options())};
}

}  // namespace skip_tp
}  // namespace cfm
