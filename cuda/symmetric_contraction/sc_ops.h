// The cfm::symmetric_contraction_{fwd,bwd,bwd2} operators: checks, descriptor unpacking, output
// allocation (the one binding layer; CPU and CUDA differ only in their Runner), Meta kernels and
// the C++ autograd (fwd -> bwd -> bwd2; a third derivative raises).
//
// Descriptor hand-off (cfm_plugins/ops/descriptors/symmetric_contraction.py, SCDescriptor.tensors):
//   desc = [parent, last, slot, term_ptr, term_row, term_out (int32), out_base (int64), out_stride (int32)]
//   meta = [L, J, S, O, out_dim, R, C, Cp]
// Per call: x [N, C, L], coeff [E', R, Cp] (folded weights of the elements present), elem [N]
// (row of coeff per node), order [N] (nodes sorted by element), chunk_ptr [chunks+1] (int64).
#pragma once
#include <tuple>
#include <vector>

#include "cfm_ops.h"
#include "sc_cpu_api.h"

namespace cfm {
namespace sc {

constexpr const char* kFwd = "cfm::symmetric_contraction_fwd";
constexpr const char* kBwd = "cfm::symmetric_contraction_bwd";
constexpr const char* kBwd2 = "cfm::symmetric_contraction_bwd2";

inline const char* kSchemaFwd =
    "symmetric_contraction_fwd(Tensor x, Tensor coeff, Tensor elem, Tensor order, Tensor chunk_ptr, "
    "Tensor[] desc, int[] meta) -> Tensor";
inline const char* kSchemaBwd =
    "symmetric_contraction_bwd(Tensor gout, Tensor x, Tensor coeff, Tensor elem, Tensor order, Tensor chunk_ptr, "
    "Tensor[] desc, int[] meta, bool need_gx, bool need_gc) -> (Tensor, Tensor)";
inline const char* kSchemaBwd2 =
    "symmetric_contraction_bwd2(Tensor gout, Tensor x, Tensor coeff, Tensor? dx, Tensor? dcoeff, Tensor elem, "
    "Tensor order, Tensor chunk_ptr, Tensor[] desc, int[] meta, bool need_ggout, bool need_gx, bool need_gc) "
    "-> (Tensor, Tensor, Tensor)";

inline ScArgs make_args(const char* op, const Tensor& x, const Tensor& coeff, const Tensor& elem, const Tensor& order,
                        const Tensor& chunk_ptr, at::TensorList desc, at::IntArrayRef meta, int nthreads) {
  TORCH_CHECK(desc.size() == 8 && meta.size() == 8, op, ": the descriptor is 8 tensors and 8 ints, got ",
              desc.size(), " and ", meta.size());
  check_float(op, x, "x");
  check_same(op, x, coeff, "coeff");
  TORCH_CHECK(coeff.is_contiguous(), op, ": coeff must be contiguous");
  TORCH_CHECK(x.dim() == 3 && x.size(1) == meta[6] && x.size(2) == meta[0], op, ": x must be [N, ", meta[6], ", ",
              meta[0], "], got ", x.sizes());
  TORCH_CHECK(coeff.dim() == 3 && coeff.size(1) == meta[5] && coeff.size(2) == meta[7], op, ": coeff must be [E, ",
              meta[5], ", ", meta[7], "], got ", coeff.sizes());
  const char* names[3] = {"elem", "order", "chunk_ptr"};
  const Tensor* index[3] = {&elem, &order, &chunk_ptr};
  for (int i = 0; i < 3; ++i) {
    check_index(op, *index[i], names[i], at::kLong);
    TORCH_CHECK(index[i]->device() == x.device(), op, ": ", names[i], " is on ", index[i]->device());
  }
  TORCH_CHECK(elem.numel() == x.size(0) && order.numel() == x.size(0) && chunk_ptr.numel() >= 1, op,
              ": elem and order must have one entry per node");
  for (size_t i = 0; i < 8; ++i) {
    check_index(op, desc[i], "a descriptor table", i == 6 ? at::kLong : at::kInt);
    TORCH_CHECK(desc[i].device() == x.device(), op, ": descriptor table ", i, " is on ", desc[i].device(),
                " but x is on ", x.device(), " (move the module with .to())");
  }
  ScArgs a;
  a.d.L = static_cast<int>(meta[0]);
  a.d.J = static_cast<int>(meta[1]);
  a.d.S = static_cast<int>(meta[2]);
  a.d.O = static_cast<int>(meta[3]);
  a.d.out_dim = meta[4];
  a.R = meta[5];
  a.C = meta[6];
  a.Cp = meta[7];
  a.d.parent = desc[0].data_ptr<std::int32_t>();
  a.d.last = desc[1].data_ptr<std::int32_t>();
  a.d.slot = desc[2].data_ptr<std::int32_t>();
  a.d.term_ptr = desc[3].data_ptr<std::int32_t>();
  a.d.term_row = desc[4].data_ptr<std::int32_t>();
  a.d.term_out = desc[5].data_ptr<std::int32_t>();
  a.d.out_base = desc[6].data_ptr<std::int64_t>();
  a.d.out_stride = desc[7].data_ptr<std::int32_t>();
  a.nchunks = chunk_ptr.numel() - 1;
  a.nthreads = nthreads > 0 ? nthreads : 1;
  a.elem = elem.data_ptr<std::int64_t>();
  a.order = order.data_ptr<std::int64_t>();
  a.chunk_ptr = chunk_ptr.data_ptr<std::int64_t>();
  a.x = x.data_ptr();
  a.coeff = coeff.data_ptr();
  return a;
}

inline void check_gout(const char* op, const Tensor& x, const Tensor& gout, at::IntArrayRef meta) {
  check_same(op, x, gout, "gout");
  TORCH_CHECK(gout.is_contiguous() && gout.dim() == 2 && gout.size(0) == x.size(0) && gout.size(1) == meta[4], op,
              ": gout must be contiguous [N, ", meta[4], "], got ", gout.sizes());
}

// ---- device kernels (Runner: static void run(int op, bool is_double, const ScArgs&), threads()) ----
template <typename Runner>
Tensor fwd(const Tensor& x, const Tensor& coeff, const Tensor& elem, const Tensor& order, const Tensor& chunk_ptr,
           at::TensorList desc, at::IntArrayRef meta) {
  ScArgs a = make_args(kFwd, x, coeff, elem, order, chunk_ptr, desc, meta, Runner::threads());
  Tensor out = at::empty({x.size(0), meta[4]}, x.options());
  if (x.size(0) == 0) return out;
  a.out0 = out.data_ptr();
  Runner::run(0, x.scalar_type() == at::kDouble, a);
  return out;
}

template <typename Runner>
std::tuple<Tensor, Tensor> bwd(const Tensor& gout, const Tensor& x, const Tensor& coeff, const Tensor& elem,
                               const Tensor& order, const Tensor& chunk_ptr, at::TensorList desc,
                               at::IntArrayRef meta, bool need_gx, bool need_gc) {
  ScArgs a = make_args(kBwd, x, coeff, elem, order, chunk_ptr, desc, meta, Runner::threads());
  check_gout(kBwd, x, gout, meta);
  Tensor gx = need_gx ? at::empty_like(x) : none_like(x);
  Tensor gc = need_gc ? at::zeros_like(coeff) : none_like(coeff);
  if (x.size(0) && (need_gx || need_gc)) {
    a.gout = gout.data_ptr();
    a.out0 = need_gx ? gx.data_ptr() : nullptr;
    a.out1 = need_gc ? gc.data_ptr() : nullptr;
    Runner::run(1, x.scalar_type() == at::kDouble, a);
  } else if (need_gx) {
    gx.zero_();
  }
  return {gx, gc};
}

template <typename Runner>
std::tuple<Tensor, Tensor, Tensor> bwd2(const Tensor& gout, const Tensor& x, const Tensor& coeff,
                                        const std::optional<Tensor>& dx, const std::optional<Tensor>& dcoeff,
                                        const Tensor& elem, const Tensor& order, const Tensor& chunk_ptr,
                                        at::TensorList desc, at::IntArrayRef meta, bool need_ggout, bool need_gx,
                                        bool need_gc) {
  ScArgs a = make_args(kBwd2, x, coeff, elem, order, chunk_ptr, desc, meta, Runner::threads());
  check_gout(kBwd2, x, gout, meta);
  const bool has_dx = dx.has_value() && dx->defined(), has_dc = dcoeff.has_value() && dcoeff->defined();
  if (has_dx) {
    check_same(kBwd2, x, *dx, "dx");
    TORCH_CHECK(dx->is_contiguous() && dx->sizes() == x.sizes(), kBwd2, ": dx must be contiguous like x");
  }
  if (has_dc) {
    check_same(kBwd2, x, *dcoeff, "dcoeff");
    TORCH_CHECK(dcoeff->is_contiguous() && dcoeff->sizes() == coeff.sizes(), kBwd2,
                ": dcoeff must be contiguous like coeff");
  }
  Tensor ggout = need_ggout ? at::empty_like(gout) : none_like(gout);
  Tensor gx2 = need_gx ? at::empty_like(x) : none_like(x);
  Tensor gc2 = need_gc ? at::zeros_like(coeff) : none_like(coeff);
  if (x.size(0) && (need_ggout || need_gx || need_gc)) {
    a.dx = has_dx ? dx->data_ptr() : nullptr;
    a.dcoeff = has_dc ? dcoeff->data_ptr() : nullptr;
    a.gout = gout.data_ptr();
    a.out0 = need_ggout ? ggout.data_ptr() : nullptr;
    a.out1 = need_gx ? gx2.data_ptr() : nullptr;
    a.out2 = need_gc ? gc2.data_ptr() : nullptr;
    Runner::run(2, x.scalar_type() == at::kDouble, a);
  } else {
    ggout.zero_();
    gx2.zero_();
  }
  return {ggout, gx2, gc2};
}

// ---- Meta kernels: shapes only (fake tensors of torch.compile / torch.export) ----
inline Tensor empty_meta_like(const Tensor& t, bool needed) {
  return needed ? at::empty_like(t) : at::empty({0}, t.options());
}

inline Tensor fwd_meta(const Tensor& x, const Tensor& coeff, const Tensor& elem, const Tensor& order,
                       const Tensor& chunk_ptr, at::TensorList desc, at::IntArrayRef meta) {
  return at::empty_symint({x.sym_size(0), c10::SymInt(meta[4])}, x.options());
}

inline std::tuple<Tensor, Tensor> bwd_meta(const Tensor& gout, const Tensor& x, const Tensor& coeff,
                                           const Tensor& elem, const Tensor& order, const Tensor& chunk_ptr,
                                           at::TensorList desc, at::IntArrayRef meta, bool need_gx, bool need_gc) {
  return {empty_meta_like(x, need_gx), empty_meta_like(coeff, need_gc)};
}

inline std::tuple<Tensor, Tensor, Tensor> bwd2_meta(const Tensor& gout, const Tensor& x, const Tensor& coeff,
                                                    const std::optional<Tensor>& dx,
                                                    const std::optional<Tensor>& dcoeff, const Tensor& elem,
                                                    const Tensor& order, const Tensor& chunk_ptr, at::TensorList desc,
                                                    at::IntArrayRef meta, bool need_ggout, bool need_gx,
                                                    bool need_gc) {
  return {empty_meta_like(gout, need_ggout), empty_meta_like(x, need_gx), empty_meta_like(coeff, need_gc)};
}

}  // namespace sc
}  // namespace cfm
