// Arguments of the kernel drivers (CPU and CUDA: raw pointers unpacked from tensors once, in
// sc_ops.h) and the CPU entry points.
#pragma once
#include <cstdint>

#include "sc_desc.h"

struct ScArgs {
  cfm::sc::Desc d;
  std::int64_t R = 0;        // coefficient rows (terms)
  std::int64_t C = 0;        // channels
  std::int64_t Cp = 0;       // padded channel stride of the coefficient tensors
  const std::int64_t* elem = nullptr;       // [N] element (row of the coefficient tensor) per node
  const std::int64_t* order = nullptr;      // [N] nodes sorted by element
  const std::int64_t* chunk_ptr = nullptr;  // [nchunks+1] one element per chunk
  std::int64_t nchunks = 0;
  int nthreads = 1;
  const void* x = nullptr;
  const void* dx = nullptr;      // bwd2: tangent of x (grad of gx), may be null
  const void* coeff = nullptr;
  const void* dcoeff = nullptr;  // bwd2: tangent of coeff (grad of gcoeff), may be null
  const void* gout = nullptr;
  void* out0 = nullptr;  // fwd: out; bwd: gx; bwd2: grad of gout
  void* out1 = nullptr;  // bwd: gcoeff (accumulated, zero-initialised); bwd2: gx2
  void* out2 = nullptr;  // bwd2: gcoeff2 (accumulated, zero-initialised)
};

// op: 0 forward, 1 backward, 2 double backward.
void sc_generic_run(int op, bool is_double, const ScArgs& a);
#if defined(__x86_64__) && defined(__GNUC__)
#define CFM_SC_HAVE_AVX2 1
void sc_avx2_run(int op, bool is_double, const ScArgs& a);
#endif
