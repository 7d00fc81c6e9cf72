// CPU drivers of the fused symmetric contraction: OpenMP over (node chunk, channel tile) tasks,
// the arithmetic of sc_math.h vectorized over a tile of TC channels.
//
// Nodes arrive sorted by element (``order``) and cut into chunks of one element each
// (``chunk_ptr``), so a task reuses one element's coefficients from cache, and the coefficient
// gradient of a chunk is summed in a task-local buffer and added once (atomically only when the
// element's nodes span several chunks).
//
// Included by sc_generic_cpu.cpp and sc_avx2_cpu.cpp inside a namespace of their own (one
// instruction set each; sc_ops.cpp picks at run time), so no inline symbol is shared.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "sc_math.h"
#include "sc_cpu_api.h"

namespace {

constexpr int TC = 16;  // channel lanes per task

using cfm::sc::Desc;

// The element of chunk k; -1 for an empty chunk (a traced forward pads its chunk list with empty
// chunks at the end, so that their number depends only on the shapes).
inline std::int64_t chunk_elem(const ScArgs& a, std::int64_t k) {
  return a.chunk_ptr[k] < a.chunk_ptr[k + 1] ? a.elem[a.order[a.chunk_ptr[k]]] : -1;
}

inline bool chunk_shared(const ScArgs& a, std::int64_t k) {
  const std::int64_t e = chunk_elem(a, k);
  return (k > 0 && chunk_elem(a, k - 1) == e) || (k + 1 < a.nchunks && chunk_elem(a, k + 1) == e);
}

template <typename T>
void flush(const ScArgs& a, std::int64_t k, const T* local, T* dst, int nvalid) {
  const bool shared = chunk_shared(a, k);
  for (std::int64_t r = 0; r < a.R; ++r) {
    const T* lr = local + r * TC;
    T* dr = dst + r * a.Cp;
    if (shared) {
      for (int c = 0; c < nvalid; ++c) {
#pragma omp atomic
        dr[c] += lr[c];
      }
    } else {
      for (int c = 0; c < nvalid; ++c) dr[c] += lr[c];
    }
  }
}

// The task loop every pass shares: tasks are (chunk k of one element, channel tile c0) pairs,
// each thread has a scratch of `scratch_rows` x TC, and where the pass makes a coefficient
// gradient (`gc`), a task-local [R x TC] sum is flushed once per task. `body(n, coeff_offset,
// c0, nvalid, scratch, local)` runs the pass on node n.
template <typename T, typename Body>
void for_each_task(const ScArgs& a, std::size_t scratch_rows, T* gc, Body body) {
  const std::int64_t ntiles = (a.C + TC - 1) / TC;
  const std::int64_t ntasks = a.nchunks * ntiles;
#pragma omp parallel num_threads(a.nthreads)
  {
    std::vector<T> s(scratch_rows * TC);
    std::vector<T> local(gc ? a.R * TC : 0);
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < ntasks; ++task) {
      const std::int64_t k = task / ntiles;
      if (a.chunk_ptr[k] == a.chunk_ptr[k + 1]) continue;  // an empty chunk: nothing to do
      const int c0 = static_cast<int>((task % ntiles) * TC);
      const int nvalid = static_cast<int>(std::min<std::int64_t>(TC, a.C - c0));
      if (gc) std::fill(local.begin(), local.end(), T(0));
      const std::int64_t coff = chunk_elem(a, k) * a.R * a.Cp + c0;
      for (std::int64_t i = a.chunk_ptr[k]; i < a.chunk_ptr[k + 1]; ++i)
        body(a.order[i], coff, c0, nvalid, s.data(), gc ? local.data() : nullptr);
      if (gc) flush<T>(a, k, local.data(), gc + coff, nvalid);
    }
  }
}

template <typename T>
void run_fwd(const ScArgs& a) {
  const Desc& d = a.d;
  const T* x = static_cast<const T*>(a.x);
  const T* coeff = static_cast<const T*>(a.coeff);
  T* out = static_cast<T*>(a.out0);
  for_each_task<T>(a, cfm::sc::fwd_rows(d), nullptr,
                   [&](std::int64_t n, std::int64_t coff, int c0, int nvalid, T* s, T*) {
                     cfm::sc::fwd_node<T, TC>(d, x + (n * a.C + c0) * d.L, nvalid, coeff + coff, a.Cp,
                                              out + n * d.out_dim, c0, s, TC);
                   });
}

template <typename T>
void run_bwd(const ScArgs& a) {
  const Desc& d = a.d;
  const T* x = static_cast<const T*>(a.x);
  const T* coeff = static_cast<const T*>(a.coeff);
  const T* gout = static_cast<const T*>(a.gout);
  T* gx = static_cast<T*>(a.out0);
  for_each_task<T>(a, cfm::sc::bwd_rows(d), static_cast<T*>(a.out1),
                   [&](std::int64_t n, std::int64_t coff, int c0, int nvalid, T* s, T* local) {
                     cfm::sc::bwd_node<T, TC>(d, x + (n * a.C + c0) * d.L, nvalid, coeff + coff, a.Cp,
                                              gout + n * d.out_dim, c0, gx ? gx + (n * a.C + c0) * d.L : nullptr,
                                              local, TC, cfm::sc::PlainAdd{}, s, TC);
                   });
}

template <typename T>
void run_bwd2(const ScArgs& a) {
  const Desc& d = a.d;
  const T* x = static_cast<const T*>(a.x);
  const T* dx = static_cast<const T*>(a.dx);
  const T* coeff = static_cast<const T*>(a.coeff);
  const T* dcoeff = static_cast<const T*>(a.dcoeff);
  const T* gout = static_cast<const T*>(a.gout);
  T* ggout = static_cast<T*>(a.out0);
  T* gx2 = static_cast<T*>(a.out1);
  for_each_task<T>(a, cfm::sc::bwd2_rows(d), static_cast<T*>(a.out2),
                   [&](std::int64_t n, std::int64_t coff, int c0, int nvalid, T* s, T* local) {
                     const std::int64_t xoff = (n * a.C + c0) * d.L;
                     cfm::sc::bwd2_node<T, TC>(d, x + xoff, dx ? dx + xoff : nullptr, nvalid, coeff + coff,
                                               dcoeff ? dcoeff + coff : nullptr, a.Cp, gout + n * d.out_dim, c0,
                                               ggout ? ggout + n * d.out_dim : nullptr, gx2 ? gx2 + xoff : nullptr,
                                               local, TC, cfm::sc::PlainAdd{}, s, TC);
                   });
}

}  // namespace

void SC_CPU_NS(run)(int op, bool is_double, const ScArgs& a) {
  if (is_double) {
    if (op == 0) run_fwd<double>(a);
    else if (op == 1) run_bwd<double>(a);
    else run_bwd2<double>(a);
  } else {
    if (op == 0) run_fwd<float>(a);
    else if (op == 1) run_bwd<float>(a);
    else run_bwd2<float>(a);
  }
}
