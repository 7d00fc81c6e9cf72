// The symmetric-contraction descriptor as raw arrays (see sc_math.h and
// cfm_plugins/ops/descriptors/symmetric_contraction.py). A plain struct: no code.
#pragma once
#include <cstdint>

namespace cfm {
namespace sc {

// The descriptor as raw arrays (device or host pointers).
struct Desc {
  int L;            // ell components of x (num_ell)
  int J;            // monomials
  int S;            // stored monomials (scratch rows)
  int O;            // output components per channel
  std::int64_t out_dim;  // output row length per node
  const std::int32_t* parent;
  const std::int32_t* last;
  const std::int32_t* slot;
  const std::int32_t* term_ptr;  // [J+1]
  const std::int32_t* term_row;  // [T]
  const std::int32_t* term_out;  // [T]
  const std::int64_t* out_base;  // [O]
  const std::int32_t* out_stride;  // [O]
};

}  // namespace sc
}  // namespace cfm
