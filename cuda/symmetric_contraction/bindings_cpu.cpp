// pybind11 bindings of the CPU symmetric-contraction kernels (module cfm_plugins._C_symmetric_contraction).
//
// Tensors cross as data_ptr() ints plus sizes; no torch headers. The Python side
// (cfm_plugins/ops/symmetric_contraction.py) validates shapes, dtypes and contiguity.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "sc_cpu_api.h"

namespace py = pybind11;

namespace {

template <typename T>
const T* cptr(std::uintptr_t p) { return reinterpret_cast<const T*>(p); }

// desc = [L, J, S, O, out_dim, R, parent, last, slot, term_ptr, term_row, term_out, out_base, out_stride]
// sizes = [C, Cp, nchunks, nthreads]; index = [elem, order, chunk_ptr]
ScCpuArgs make_args(const std::vector<std::int64_t>& desc, const std::vector<std::int64_t>& sizes,
                    const std::vector<std::uintptr_t>& index) {
  if (desc.size() != 14 || sizes.size() != 4 || index.size() != 3)
    throw std::invalid_argument("symmetric_contraction: bad descriptor/size/index lists");
  ScCpuArgs a;
  a.d.L = static_cast<int>(desc[0]);
  a.d.J = static_cast<int>(desc[1]);
  a.d.S = static_cast<int>(desc[2]);
  a.d.O = static_cast<int>(desc[3]);
  a.d.out_dim = desc[4];
  a.R = desc[5];
  a.d.parent = cptr<std::int32_t>(desc[6]);
  a.d.last = cptr<std::int32_t>(desc[7]);
  a.d.slot = cptr<std::int32_t>(desc[8]);
  a.d.term_ptr = cptr<std::int32_t>(desc[9]);
  a.d.term_row = cptr<std::int32_t>(desc[10]);
  a.d.term_out = cptr<std::int32_t>(desc[11]);
  a.d.out_base = cptr<std::int64_t>(desc[12]);
  a.d.out_stride = cptr<std::int32_t>(desc[13]);
  a.C = sizes[0];
  a.Cp = sizes[1];
  a.nchunks = sizes[2];
  a.nthreads = static_cast<int>(sizes[3] > 0 ? sizes[3] : 1);
  a.elem = cptr<std::int64_t>(index[0]);
  a.order = cptr<std::int64_t>(index[1]);
  a.chunk_ptr = cptr<std::int64_t>(index[2]);
  return a;
}

bool is_double(const std::string& dtype) {
  if (dtype == "float64") return true;
  if (dtype == "float32") return false;
  throw std::invalid_argument("symmetric_contraction: dtype must be float32 or float64, got " + dtype);
}

bool use_avx2() {
#if defined(CFM_SC_HAVE_AVX2)
  static const bool ok = __builtin_cpu_supports("avx2");
  return ok;
#else
  return false;
#endif
}

void run(int op, const std::string& dtype, const ScCpuArgs& a) {
  const bool dbl = is_double(dtype);
  py::gil_scoped_release nogil;
#if defined(CFM_SC_HAVE_AVX2)
  if (use_avx2()) { sc_avx2_run(op, dbl, a); return; }
#endif
  sc_generic_run(op, dbl, a);
}

void* vp(std::uintptr_t p) { return reinterpret_cast<void*>(p); }

}  // namespace

PYBIND11_MODULE(_C_symmetric_contraction, m) {
  m.doc() = "Fused MACE symmetric contraction: CPU kernels (OpenMP, channel-vectorized)";
  m.def("isa", []() { return std::string(use_avx2() ? "avx2" : "baseline"); });
  m.def(
      "forward",
      [](const std::string& dtype, const std::vector<std::int64_t>& desc, const std::vector<std::int64_t>& sizes,
         const std::vector<std::uintptr_t>& index, std::uintptr_t x, std::uintptr_t coeff, std::uintptr_t out) {
        ScCpuArgs a = make_args(desc, sizes, index);
        a.x = vp(x);
        a.coeff = vp(coeff);
        a.out0 = vp(out);
        run(0, dtype, a);
      },
      "out[N, out_dim] = sum_terms coeff[elem[n], row, c] * monomial(x[n, c])");
  m.def(
      "backward",
      [](const std::string& dtype, const std::vector<std::int64_t>& desc, const std::vector<std::int64_t>& sizes,
         const std::vector<std::uintptr_t>& index, std::uintptr_t x, std::uintptr_t coeff, std::uintptr_t gout,
         std::uintptr_t gx, std::uintptr_t gcoeff) {
        ScCpuArgs a = make_args(desc, sizes, index);
        a.x = vp(x);
        a.coeff = vp(coeff);
        a.gout = vp(gout);
        a.out0 = vp(gx);
        a.out1 = vp(gcoeff);
        run(1, dtype, a);
      },
      "gx (if gx != 0) and gcoeff += (if gcoeff != 0, zero-initialised) from gout");
  m.def(
      "double_backward",
      [](const std::string& dtype, const std::vector<std::int64_t>& desc, const std::vector<std::int64_t>& sizes,
         const std::vector<std::uintptr_t>& index, std::uintptr_t x, std::uintptr_t dx, std::uintptr_t coeff,
         std::uintptr_t dcoeff, std::uintptr_t gout, std::uintptr_t ggout, std::uintptr_t gx2, std::uintptr_t gc2) {
        ScCpuArgs a = make_args(desc, sizes, index);
        a.x = vp(x);
        a.dx = vp(dx);
        a.coeff = vp(coeff);
        a.dcoeff = vp(dcoeff);
        a.gout = vp(gout);
        a.out0 = vp(ggout);
        a.out1 = vp(gx2);
        a.out2 = vp(gc2);
        run(2, dtype, a);
      },
      "grads of the backward: ggout, gx2, gc2 (each skipped when its pointer is 0)");
}
