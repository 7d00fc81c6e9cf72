// Arithmetic of the fused symmetric contraction (MACE product basis), shared by CPU and CUDA.
//
// One call of a *_node function handles one node and W channel lanes. A lane c of scratch row r
// lives at s[r * ld + c]. The CPU passes W = channel tile (compile-time, the lane loops
// vectorize) and ld = W; the GPU passes W = 1, pointers pre-offset by threadIdx.x and
// ld = blockDim.x (scratch in shared memory, one column per thread).
//
// The polynomial (see cfm_plugins/ops/descriptors/symmetric_contraction.py):
//   P[j] = P[parent[j]] * x[last[j]]   (monomials in degree order; parent -1: P[j] = x[last[j]])
//   out[o] = sum over terms t of monomial j: coeff[row_t] * P[j], o = term_out[t]
// Only monomials that are parents of others keep a scratch row (slot >= 0).
#pragma once
#include <cstdint>

#include "cfm_common.h"
#include "sc_desc.h"

#if defined(__CUDA_ARCH__) || !defined(__GNUC__)
#define CFM_SC_LANES
#else
#define CFM_SC_LANES _Pragma("GCC ivdep")
#endif

namespace cfm {
namespace sc {

// Code below lives in an inline namespace per instruction set (CFM_SC_ISA), so the baseline and the
// AVX2 CPU builds never share an inline symbol at link time.
#ifndef CFM_SC_ISA
#define CFM_SC_ISA isa_default
#endif
inline namespace CFM_SC_ISA {


// Lane primitives over W lanes. The g++ build (CPU) uses GCC vector extensions: one W-wide
// vector op each (AVX2/SSE as compiled); nvcc (GPU, W = 1) and other compilers use plain loops.
#if defined(__GNUC__) && !defined(__CUDACC__)

#define CFM_SC_VEC 1
template <typename T, int W>
struct LaneVec {
  typedef T type __attribute__((vector_size(sizeof(T) * W)));
};
template <typename T, int W>
inline typename LaneVec<T, W>::type vload(const T* p) {
  typename LaneVec<T, W>::type v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
template <typename T, int W>
inline void vstore(T* p, const typename LaneVec<T, W>::type& v) { __builtin_memcpy(p, &v, sizeof(v)); }
template <typename T, int W>
inline void lane_set(T* d, const T* a) { vstore<T, W>(d, vload<T, W>(a)); }
template <typename T, int W>
inline void lane_zero(T* d) { vstore<T, W>(d, typename LaneVec<T, W>::type{} ); }
template <typename T, int W>
inline void lane_mul(T* d, const T* a, const T* b) { vstore<T, W>(d, vload<T, W>(a) * vload<T, W>(b)); }
template <typename T, int W>
inline void lane_add(T* d, const T* a) { vstore<T, W>(d, vload<T, W>(d) + vload<T, W>(a)); }
template <typename T, int W>
inline void lane_fma(T* d, const T* a, const T* b) {
  vstore<T, W>(d, vload<T, W>(d) + vload<T, W>(a) * vload<T, W>(b));
}
template <typename T, int W>  // d += a*b + e*f
inline void lane_fma2(T* d, const T* a, const T* b, const T* e, const T* f) {
  vstore<T, W>(d, vload<T, W>(d) + (vload<T, W>(a) * vload<T, W>(b) + vload<T, W>(e) * vload<T, W>(f)));
}
template <typename T, int W>  // d = a*b + e*f
inline void lane_dot2(T* d, const T* a, const T* b, const T* e, const T* f) {
  vstore<T, W>(d, vload<T, W>(a) * vload<T, W>(b) + vload<T, W>(e) * vload<T, W>(f));
}
#else
template <typename T, int W>
CFM_HD_LOCAL void lane_set(T* d, const T* a) {
  for (int c = 0; c < W; ++c) d[c] = a[c];
}
template <typename T, int W>
CFM_HD_LOCAL void lane_zero(T* d) {
  for (int c = 0; c < W; ++c) d[c] = T(0);
}
template <typename T, int W>
CFM_HD_LOCAL void lane_mul(T* d, const T* a, const T* b) {
  for (int c = 0; c < W; ++c) d[c] = a[c] * b[c];
}
template <typename T, int W>
CFM_HD_LOCAL void lane_add(T* d, const T* a) {
  for (int c = 0; c < W; ++c) d[c] += a[c];
}
template <typename T, int W>
CFM_HD_LOCAL void lane_fma(T* d, const T* a, const T* b) {
  for (int c = 0; c < W; ++c) d[c] += a[c] * b[c];
}
template <typename T, int W>  // d += a*b + e*f
CFM_HD_LOCAL void lane_fma2(T* d, const T* a, const T* b, const T* e, const T* f) {
  for (int c = 0; c < W; ++c) d[c] += a[c] * b[c] + e[c] * f[c];
}
template <typename T, int W>  // d = a*b + e*f
CFM_HD_LOCAL void lane_dot2(T* d, const T* a, const T* b, const T* e, const T* f) {
  for (int c = 0; c < W; ++c) d[c] = a[c] * b[c] + e[c] * f[c];
}
#endif

struct PlainAdd {
  template <typename T>
  CFM_HD void operator()(T* p, T v) const { *p += v; }
};

template <typename T, int W>
CFM_HD_LOCAL void zero_rows(T* s, int rows, int ld) {
  for (int r = 0; r < rows; ++r) {
    lane_zero<T, W>(s + r * ld);
  }
}

// xt[l][c] = x[node, c0 + c, l] (zero for invalid lanes). xn points at x[node, c0, 0].
template <typename T, int W>
CFM_HD_LOCAL void load_x(const Desc& d, const T* xn, int nvalid, T* xt, int ld) {
  for (int c = 0; c < W; ++c)
    for (int l = 0; l < d.L; ++l) xt[l * ld + c] = c < nvalid ? xn[c * d.L + l] : T(0);
}

template <typename T, int W>
CFM_HD_LOCAL void store_x(const Desc& d, const T* xt, int nvalid, T* xn, int ld) {
  for (int c = 0; c < W; ++c)
    if (c < nvalid)
      for (int l = 0; l < d.L; ++l) xn[c * d.L + l] = xt[l * ld + c];
}

// go[o][c] = out_row[out_base[o] + (c0 + c) * out_stride[o]]
template <typename T, int W>
CFM_HD_LOCAL void load_out(const Desc& d, const T* on, int c0, int nvalid, T* go, int ld) {
  for (int o = 0; o < d.O; ++o)
    for (int c = 0; c < W; ++c)
      go[o * ld + c] = c < nvalid ? on[d.out_base[o] + (std::int64_t)(c0 + c) * d.out_stride[o]] : T(0);
}

template <typename T, int W>
CFM_HD_LOCAL void store_out(const Desc& d, const T* acc, int c0, int nvalid, T* on, int ld) {
  for (int o = 0; o < d.O; ++o)
    for (int c = 0; c < W; ++c)
      if (c < nvalid) on[d.out_base[o] + (std::int64_t)(c0 + c) * d.out_stride[o]] = acc[o * ld + c];
}

// Value of monomial j into v (stored rows already filled for its parent).
template <typename T, int W>
CFM_HD_LOCAL void monomial(const Desc& d, int j, const T* xt, const T* P, T* v, int ld) {
  const int p = d.parent[j];
  const T* xl = xt + d.last[j] * ld;
  if (p < 0) lane_set<T, W>(v, xl);
  else lane_mul<T, W>(v, P + d.slot[p] * ld, xl);
}

// Scratch rows needed by each node function (times ld lanes).
CFM_HD_LOCAL int fwd_rows(const Desc& d) { return d.L + d.S + 1 + d.O; }
CFM_HD_LOCAL int bwd_rows(const Desc& d) { return d.L + d.S + 1 + d.O + d.S + d.L + 1; }
CFM_HD_LOCAL int bwd2_rows(const Desc& d) { return 2 * d.L + 2 * d.S + 2 + d.O + 2 * d.S + d.L + d.O + 2; }

// Forward: out row of one node. ce = coeff[e] + c0 (row stride cld).
template <typename T, int W>
CFM_HD_LOCAL void fwd_node(const Desc& d, const T* xn, int nvalid, const T* ce, std::int64_t cld, T* on, int c0,
                     T* s, int ld) {
  T* xt = s;
  T* P = xt + d.L * ld;
  T* tmp = P + d.S * ld;
  T* acc = tmp + ld;
  load_x<T, W>(d, xn, nvalid, xt, ld);
  zero_rows<T, W>(acc, d.O, ld);
  for (int j = 0; j < d.J; ++j) {
    const int sl = d.slot[j];
    T* v = sl >= 0 ? P + sl * ld : tmp;
    monomial<T, W>(d, j, xt, P, v, ld);
    for (int t = d.term_ptr[j]; t < d.term_ptr[j + 1]; ++t) {
      lane_fma<T, W>(acc + d.term_out[t] * ld, ce + d.term_row[t] * cld, v);
    }
  }
  store_out<T, W>(d, acc, c0, nvalid, on, ld);
}

// Backward of one node: gx row (if gxn) and accumulation of d out / d coeff into gce (if gce;
// gce[row * gld + c] += ...). gon: the node's grad-output row.
template <typename T, int W, typename Add>
CFM_HD_LOCAL void bwd_node(const Desc& d, const T* xn, int nvalid, const T* ce, std::int64_t cld, const T* gon,
                     int c0, T* gxn, T* gce, std::int64_t gld, Add add, T* s, int ld) {
  T* xt = s;
  T* P = xt + d.L * ld;
  T* tmp = P + d.S * ld;
  T* go = tmp + ld;
  T* Pb = go + d.O * ld;
  T* gx = Pb + d.S * ld;
  T* gb = gx + d.L * ld;
  load_x<T, W>(d, xn, nvalid, xt, ld);
  load_out<T, W>(d, gon, c0, nvalid, go, ld);
  for (int j = 0; j < d.J; ++j)
    if (d.slot[j] >= 0) monomial<T, W>(d, j, xt, P, P + d.slot[j] * ld, ld);
  if (gxn) {
    zero_rows<T, W>(Pb, d.S, ld);
    zero_rows<T, W>(gx, d.L, ld);
  }
  for (int j = d.J - 1; j >= 0; --j) {
    const int sl = d.slot[j];
    const int t0 = d.term_ptr[j], t1 = d.term_ptr[j + 1];
    if (gce && t1 > t0) {
      const T* v = tmp;
      if (sl >= 0) v = P + sl * ld;
      else monomial<T, W>(d, j, xt, P, tmp, ld);
      for (int t = t0; t < t1; ++t) {
        const T* g = go + d.term_out[t] * ld;
        T* gr = gce + d.term_row[t] * gld;
        for (int c = 0; c < W; ++c) add(gr + c, g[c] * v[c]);
      }
    }
    if (!gxn) continue;
    if (sl >= 0) lane_set<T, W>(gb, Pb + sl * ld);
    else lane_zero<T, W>(gb);
    for (int t = t0; t < t1; ++t) lane_fma<T, W>(gb, ce + d.term_row[t] * cld, go + d.term_out[t] * ld);
    const int p = d.parent[j];
    const int l = d.last[j];
    T* gxl = gx + l * ld;
    if (p < 0) {
      lane_add<T, W>(gxl, gb);
    } else {
      lane_fma<T, W>(gxl, gb, P + d.slot[p] * ld);
      lane_fma<T, W>(Pb + d.slot[p] * ld, gb, xt + l * ld);
    }
  }
  if (gxn) store_x<T, W>(d, gx, nvalid, gxn, ld);
}

// Double backward of one node. Inputs: the tangents dxn (grad of gx, may be null) and dce
// (grad of gcoeff for this element, row stride cld, may be null), the node's grad-output row gon.
// Outputs: ggon (grad of the grad-output row, if non-null), gx2n (grad of x, if non-null) and
// accumulation into gc2 (grad of coeff, if non-null, row stride gld).
template <typename T, int W, typename Add>
CFM_HD_LOCAL void bwd2_node(const Desc& d, const T* xn, const T* dxn, int nvalid, const T* ce, const T* dce,
                      std::int64_t cld, const T* gon, int c0, T* ggon, T* gx2n, T* gc2, std::int64_t gld,
                      Add add, T* s, int ld) {
  T* xt = s;
  T* dx = xt + d.L * ld;
  T* P = dx + d.L * ld;
  T* Tn = P + d.S * ld;
  T* tP = Tn + d.S * ld;
  T* tT = tP + ld;
  T* go = tT + ld;
  T* Pb = go + d.O * ld;
  T* Tb = Pb + d.S * ld;
  T* xb = Tb + d.S * ld;
  T* gg = xb + d.L * ld;
  T* bP = gg + d.O * ld;
  T* bT = bP + ld;
  const bool has_dx = dxn != nullptr;
  const bool has_dc = dce != nullptr;
  load_x<T, W>(d, xn, nvalid, xt, ld);
  if (has_dx) load_x<T, W>(d, dxn, nvalid, dx, ld);
  else zero_rows<T, W>(dx, d.L, ld);
  load_out<T, W>(d, gon, c0, nvalid, go, ld);
  if (ggon) zero_rows<T, W>(gg, d.O, ld);
  // Forward: P and its tangent T along dx.
  for (int j = 0; j < d.J; ++j) {
    const int sl = d.slot[j];
    T* vP = sl >= 0 ? P + sl * ld : tP;
    T* vT = sl >= 0 ? Tn + sl * ld : tT;
    const int p = d.parent[j];
    const T* xl = xt + d.last[j] * ld;
    const T* dl = dx + d.last[j] * ld;
    if (p < 0) {
      lane_set<T, W>(vP, xl);
      lane_set<T, W>(vT, dl);
    } else {
      const T* pp = P + d.slot[p] * ld;
      lane_mul<T, W>(vP, pp, xl);
      lane_dot2<T, W>(vT, Tn + d.slot[p] * ld, xl, pp, dl);
    }
    for (int t = d.term_ptr[j]; t < d.term_ptr[j + 1]; ++t) {
      const int r = d.term_row[t];
      const int o = d.term_out[t];
      if (ggon) {
        if (has_dc) lane_fma2<T, W>(gg + o * ld, ce + r * cld, vT, dce + r * cld, vP);
        else lane_fma<T, W>(gg + o * ld, ce + r * cld, vT);
      }
      if (gc2 && has_dx) {
        const T* g = go + o * ld;
        T* gr = gc2 + r * gld;
        for (int c = 0; c < W; ++c) add(gr + c, g[c] * vT[c]);
      }
    }
  }
  if (ggon) store_out<T, W>(d, gg, c0, nvalid, ggon, ld);
  if (!gx2n) return;
  // Reverse: seeds dS/dT[j] = sum_t go*coeff, dS/dP[j] = sum_t go*dcoeff.
  zero_rows<T, W>(Pb, d.S, ld);
  zero_rows<T, W>(Tb, d.S, ld);
  zero_rows<T, W>(xb, d.L, ld);
  for (int j = d.J - 1; j >= 0; --j) {
    const int sl = d.slot[j];
    if (sl >= 0) {
      lane_set<T, W>(bP, Pb + sl * ld);
      lane_set<T, W>(bT, Tb + sl * ld);
    } else {
      lane_zero<T, W>(bP);
      lane_zero<T, W>(bT);
    }
    for (int t = d.term_ptr[j]; t < d.term_ptr[j + 1]; ++t) {
      const int r = d.term_row[t];
      const T* g = go + d.term_out[t] * ld;
      if (has_dx) lane_fma<T, W>(bT, g, ce + r * cld);
      if (has_dc) lane_fma<T, W>(bP, g, dce + r * cld);
    }
    const int p = d.parent[j];
    const int l = d.last[j];
    T* xbl = xb + l * ld;
    if (p < 0) {  // P = x[l] (T = dx[l] has no x dependence)
      lane_add<T, W>(xbl, bP);
    } else {
      const int sp = d.slot[p];
      const T* xl = xt + l * ld;
      lane_fma<T, W>(Tb + sp * ld, bT, xl);
      lane_fma2<T, W>(Pb + sp * ld, bT, dx + l * ld, bP, xl);
      lane_fma2<T, W>(xbl, bT, Tn + sp * ld, bP, P + sp * ld);
    }
  }
  store_x<T, W>(d, xb, nvalid, gx2n, ld);
}

}  // namespace CFM_SC_ISA
}  // namespace sc
}  // namespace cfm
