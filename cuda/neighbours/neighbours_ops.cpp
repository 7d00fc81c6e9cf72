// The cfm::count_edges operator: edge counts of many structures at one cutoff (cfm-plan's sizes).
// CPU only, no autograd (counts are integers); a Meta kernel gives the shape for fake tensors.
#include "cfm_ops.h"
#include "neighbours_cpu.h"

namespace cfm {
namespace neighbours {
namespace {

constexpr const char* kOp = "count_edges";

Tensor count_edges(const Tensor& positions, const Tensor& offsets, const Tensor& cells,
                   const Tensor& pbc, double cutoff) {
  TORCH_CHECK(positions.scalar_type() == at::kDouble && positions.is_contiguous() &&
                  positions.dim() == 2 && positions.size(1) == 3,
              kOp, ": positions must be a contiguous float64 [N, 3] tensor");
  check_index(kOp, offsets, "offsets", at::kLong);
  TORCH_CHECK(offsets.dim() == 1 && offsets.numel() >= 1, kOp, ": offsets must be [S + 1]");
  const int64_t m = offsets.numel() - 1;
  TORCH_CHECK(cells.scalar_type() == at::kDouble && cells.is_contiguous() && cells.dim() == 3 &&
                  cells.size(0) == m && cells.size(1) == 3 && cells.size(2) == 3,
              kOp, ": cells must be a contiguous float64 [S, 3, 3] tensor (S = ", m, ")");
  TORCH_CHECK(pbc.scalar_type() == at::kBool && pbc.is_contiguous() && pbc.dim() == 2 &&
                  pbc.size(0) == m && pbc.size(1) == 3,
              kOp, ": pbc must be a contiguous bool [S, 3] tensor (S = ", m, ")");
  TORCH_CHECK(std::isfinite(cutoff) && cutoff > 0, kOp, ": cutoff must be > 0, got ", cutoff);
  const int64_t* off = offsets.data_ptr<int64_t>();
  TORCH_CHECK(m == 0 || (off[0] == 0 && off[m] == positions.size(0)), kOp,
              ": offsets must run from 0 to the number of positions (", positions.size(0), ")");
  for (int64_t s = 0; s < m; ++s)
    TORCH_CHECK(off[s + 1] >= off[s], kOp, ": offsets must not decrease (structure ", s, ")");
  Tensor out = at::empty({m}, offsets.options());
  count_edges_cpu(positions.data_ptr<double>(), off, m, cells.data_ptr<double>(),
                  reinterpret_cast<const uint8_t*>(pbc.data_ptr<bool>()), cutoff,
                  out.data_ptr<int64_t>(), CpuRunner::threads());
  return out;
}

Tensor count_edges_meta(const Tensor& positions, const Tensor& offsets, const Tensor& cells,
                        const Tensor& pbc, double cutoff) {
  return at::empty({offsets.size(0) - 1}, offsets.options());
}

}  // namespace
}  // namespace neighbours
}  // namespace cfm

TORCH_LIBRARY_FRAGMENT(cfm, m) {
  m.def("count_edges(Tensor positions, Tensor offsets, Tensor cells, Tensor pbc, float cutoff) -> Tensor");
}

TORCH_LIBRARY_IMPL(cfm, CPU, m) { m.impl("count_edges", &cfm::neighbours::count_edges); }

TORCH_LIBRARY_IMPL(cfm, Meta, m) { m.impl("count_edges", &cfm::neighbours::count_edges_meta); }
