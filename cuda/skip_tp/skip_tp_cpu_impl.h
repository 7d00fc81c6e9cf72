// CPU kernels of the skip connection (per-element linear map), OpenMP over tasks of one element's
// nodes, register-tiled GEMMs vectorised over the destination's multiplicity.
//
// Nodes arrive grouped by element (order, elem_ptr), so a task multiplies the rows of one
// element's nodes by that element's weight block, read once per row tile from cache:
//   apply: dst[n, off + v*D + m] = sum_{paths into the block} coef * sum_k src[n, s + k*D + m] W[k, e, v]
//   wgrad: gw[woff + u*E*mul_out + e*mul_out + w] = coef * sum_{n of e, m} x[n, i + u*D + m] g[n, o + w*D + m]
// Every element of the outputs is written (blocks no path reaches and elements without nodes get
// zeros), so the binding layer allocates them uninitialised. Each output element is written by one
// task, in a fixed order: deterministic, no atomics.
//
// Included by skip_tp_generic_cpu.cpp and skip_tp_avx2_cpu.cpp with SKIP_NS naming the entry points
// (one instruction set each); everything else is in an anonymous namespace, so no inline symbol is
// shared between them.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "skip_tp_cpu_api.h"

namespace cfm {
namespace skip_tp {
namespace {

constexpr int kRows = 4;            // register tile: rows
constexpr std::int64_t kChunk = 64;  // nodes per apply task
constexpr int kUChunk = 32;          // weight-gradient rows (u) per task
constexpr std::int64_t kRowChunk = 128;  // node rows gathered at a time by the weight gradient

// Lanes of the register tile: two 32-byte vectors of T (GCC/Clang vector extensions: AVX2
// registers in the AVX2 build, pairs of SSE registers in the baseline one).
template <typename T>
constexpr int lanes() {
  return 64 / static_cast<int>(sizeof(T));
}

template <typename T>
struct Vec32 {
  typedef T type __attribute__((vector_size(32)));
};

// acc[r][v] = sum_{k < K} a[r][k * as] * b[k * bs + v] for v < V (a register tile of R rows by two
// vectors).
template <typename T, int R, int V>
inline void micro_full(int K, const T* const* a, std::int64_t as, const T* b, std::int64_t bs, T (&acc)[R][V]) {
  using VT = typename Vec32<T>::type;
  constexpr int L = V / 2;
  VT c0[R], c1[R];
  for (int r = 0; r < R; ++r) c0[r] = c1[r] = VT{};
  for (int k = 0; k < K; ++k) {
    const T* bk = b + k * bs;
    VT b0, b1;
    __builtin_memcpy(&b0, bk, sizeof(VT));
    __builtin_memcpy(&b1, bk + L, sizeof(VT));
    for (int r = 0; r < R; ++r) {
      const T av = a[r][k * as];
      c0[r] += av * b0;
      c1[r] += av * b1;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < L; ++v) {
      acc[r][v] = c0[r][v];
      acc[r][L + v] = c1[r][v];
    }
}

// The same for the last columns (v < nv < V): scalar.
template <typename T, int R, int V>
inline void micro_tail(int K, const T* const* a, std::int64_t as, const T* b, std::int64_t bs, int nv,
                       T (&acc)[R][V]) {
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = T(0);
  for (int k = 0; k < K; ++k) {
    const T* bk = b + k * bs;
    for (int r = 0; r < R; ++r) {
      const T av = a[r][k * as];
      for (int v = 0; v < nv; ++v) acc[r][v] += av * bk[v];
    }
  }
}

template <typename T, int R, int V>
inline void micro_any(int K, const T* const* a, std::int64_t as, const T* b, std::int64_t bs, int nv,
                      T (&acc)[R][V]) {
  if (nv == V)
    micro_full<T, R, V>(K, a, as, b, bs, acc);
  else
    micro_tail<T, R, V>(K, a, as, b, bs, nv, acc);
}

// Small problems run on one thread: waking a team costs more than the work.
inline int threads_for(std::int64_t work, int requested) {
  constexpr std::int64_t kMinWorkPerThread = std::int64_t(1) << 17;
  const std::int64_t by_work = work / kMinWorkPerThread;
  if (by_work < 2) return 1;
  return static_cast<int>(std::min<std::int64_t>(requested, by_work));
}

struct Block {
  int off, mul, dim, p0, p1;
};

inline Block block(const Tables& t, int b) {
  const std::int32_t* r = t.blocks + 3 * b;
  return Block{r[0], r[1], r[2], t.path_ptr[b], t.path_ptr[b + 1]};
}

struct Path {
  int src_off, K;
  std::int64_t woff, ks, ns, es;
  double coef;
};

inline Path path(const Tables& t, int p) {
  const std::int32_t* r = t.paths + 6 * p;
  return Path{r[0], r[1], r[2], r[3], r[4], r[5], t.coef[p]};
}

// Multiply-adds of a whole apply (work estimate for the thread count).
inline std::int64_t apply_work(const Tables& t, std::int64_t n) {
  std::int64_t w = 0;
  for (int b = 0; b < t.n_blocks; ++b) {
    const Block bl = block(t, b);
    for (int p = bl.p0; p < bl.p1; ++p) w += std::int64_t(path(t, p).K) * bl.mul * bl.dim;
  }
  return w * n;
}

template <typename T>
void apply(const Tables& t, const Groups& g, const T* src, const T* w, T* dst, int nthreads) {
  constexpr int R = kRows, V = lanes<T>();
  const std::int64_t E = t.num_elements;
  // tasks: (element, first sorted node, end) chunks x destination blocks
  struct Task {
    std::int64_t e, s0, s1;
    int b;
  };
  std::vector<Task> tasks;
  for (std::int64_t e = 0; e < E; ++e)
    for (std::int64_t s = g.elem_ptr[e]; s < g.elem_ptr[e + 1]; s += kChunk)
      for (int b = 0; b < t.n_blocks; ++b) tasks.push_back({e, s, std::min(g.elem_ptr[e + 1], s + kChunk), b});
  const std::int64_t n_tasks = static_cast<std::int64_t>(tasks.size());
  nthreads = threads_for(apply_work(t, g.n_nodes), nthreads);
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && n_tasks > 1)
  {
    std::vector<T> wt;  // the weight blocks of a task's paths, transposed where read across rows
    std::vector<std::int64_t> wt_off;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t ti = 0; ti < n_tasks; ++ti) {
      const Task& task = tasks[ti];
      const Block bl = block(t, task.b);
      const int D = bl.dim, Nd = bl.mul;
      const std::int64_t rows = (task.s1 - task.s0) * D;
      auto out_at = [&](std::int64_t r, int v) -> T& {
        const std::int64_t node = g.order[task.s0 + r / D];
        return dst[node * t.dim_dst + bl.off + std::int64_t(v) * D + r % D];
      };
      if (bl.p0 == bl.p1) {  // no path reaches this block: zeros
        for (std::int64_t r = 0; r < rows; ++r)
          for (int v = 0; v < Nd; ++v) out_at(r, v) = T(0);
        continue;
      }
      // each path's weight block W[k, e, n] as rows along n (contiguous: the forward's own layout;
      // otherwise copied transposed once per task)
      wt_off.assign(bl.p1 - bl.p0, -1);
      std::size_t need = 0;
      for (int p = bl.p0; p < bl.p1; ++p) {
        const Path ph = path(t, p);
        if (ph.ns != 1) need += std::size_t(ph.K) * Nd;
      }
      if (wt.size() < need) wt.resize(need);
      std::size_t at = 0;
      for (int p = bl.p0; p < bl.p1; ++p) {
        const Path ph = path(t, p);
        if (ph.ns == 1) continue;
        const T* wp = w + ph.woff + task.e * ph.es;
        T* dstw = wt.data() + at;
        constexpr int TB = 16;  // transposed in 16 x 16 tiles: reads and writes stay in cache lines
        for (int k0 = 0; k0 < ph.K; k0 += TB)
          for (int n0 = 0; n0 < Nd; n0 += TB) {
            const int k1 = std::min(ph.K, k0 + TB), n1 = std::min(Nd, n0 + TB);
            for (int n = n0; n < n1; ++n)
              for (int k = k0; k < k1; ++k) dstw[std::int64_t(k) * Nd + n] = wp[k * ph.ks + n * ph.ns];
          }
        wt_off[p - bl.p0] = static_cast<std::int64_t>(at);
        at += std::size_t(ph.K) * Nd;
      }
      for (std::int64_t r0 = 0; r0 < rows; r0 += R) {
        const int nr = static_cast<int>(std::min<std::int64_t>(R, rows - r0));
        std::int64_t base[R];
        for (int r = 0; r < R; ++r) {
          const std::int64_t rr = r0 + std::min(r, nr - 1);  // a short tile repeats its last row
          base[r] = g.order[task.s0 + rr / D] * t.dim_src + rr % D;
        }
        for (int v0 = 0; v0 < Nd; v0 += V) {
          const int nv = std::min(V, Nd - v0);
          T res[R][V] = {};
          for (int p = bl.p0; p < bl.p1; ++p) {
            const Path ph = path(t, p);
            const T* a[R];
            for (int r = 0; r < R; ++r) a[r] = src + base[r] + ph.src_off;
            const std::int64_t wo = wt_off[p - bl.p0];
            const T* b = wo < 0 ? w + ph.woff + task.e * ph.es + v0 : wt.data() + wo + v0;
            const std::int64_t bs = wo < 0 ? ph.ks : Nd;
            T acc[R][V];
            micro_any<T, R, V>(ph.K, a, D, b, bs, nv, acc);
            const T c = static_cast<T>(ph.coef);
            for (int r = 0; r < R; ++r)
              for (int v = 0; v < V; ++v) res[r][v] += c * acc[r][v];
          }
          for (int r = 0; r < nr; ++r)
            for (int v = 0; v < nv; ++v) out_at(r0 + r, v0 + v) = res[r][v];
        }
      }
    }
  }
}

template <typename T>
void wgrad(const Tables& t, const Groups& g, const T* x, const T* gout, T* gw, int nthreads) {
  constexpr int R = kRows, V = lanes<T>();
  const std::int64_t E = t.num_elements;
  struct Task {
    std::int64_t e;
    int b, p, u0, u1;
  };
  std::vector<Task> tasks;
  for (std::int64_t e = 0; e < E; ++e)
    for (int b = 0; b < t.n_blocks; ++b) {
      const Block bl = block(t, b);
      for (int p = bl.p0; p < bl.p1; ++p) {
        const int U = path(t, p).K;
        for (int u0 = 0; u0 < U; u0 += kUChunk) tasks.push_back({e, b, p, u0, std::min(U, u0 + kUChunk)});
      }
    }
  const std::int64_t n_tasks = static_cast<std::int64_t>(tasks.size());
  nthreads = threads_for(apply_work(t, g.n_nodes), nthreads);
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && n_tasks > 1)
  {
    std::vector<T> xl, gl;  // gathered rows of x [rows][u] and of g [rows][w]
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t ti = 0; ti < n_tasks; ++ti) {
      const Task& task = tasks[ti];
      const Block bl = block(t, task.b);
      const Path ph = path(t, task.p);
      const int D = bl.dim, Nd = bl.mul, Uc = task.u1 - task.u0;
      const std::int64_t s0 = g.elem_ptr[task.e], s1 = g.elem_ptr[task.e + 1];
      // rows u of this task at out + u * ks, contiguous along w
      T* out = gw + ph.woff + task.e * ph.es + std::int64_t(task.u0) * ph.ks;
      const T c = static_cast<T>(ph.coef);
      if (s0 == s1) {  // an element without nodes in this batch: zero gradient
        for (int u = 0; u < Uc; ++u)
          for (int v = 0; v < Nd; ++v) out[u * ph.ks + v] = T(0);
        continue;
      }
      const std::int64_t rows = (s1 - s0) * D;
      // the first chunk of rows stores, the others add (one task owns these rows of gw)
      for (std::int64_t c0 = 0; c0 < rows; c0 += kRowChunk) {
        const int tc = static_cast<int>(std::min<std::int64_t>(kRowChunk, rows - c0));
        if (xl.size() < std::size_t(tc) * Uc) xl.resize(std::size_t(tc) * Uc);
        if (gl.size() < std::size_t(tc) * Nd) gl.resize(std::size_t(tc) * Nd);
        for (int r = 0; r < tc; ++r) {
          const std::int64_t rr = c0 + r, node = g.order[s0 + rr / D], m = rr % D;
          const T* xr = x + node * t.dim_src + ph.src_off + m;
          const T* gr = gout + node * t.dim_dst + bl.off + m;
          for (int u = 0; u < Uc; ++u) xl[std::size_t(r) * Uc + u] = xr[std::int64_t(task.u0 + u) * D];
          for (int v = 0; v < Nd; ++v) gl[std::size_t(r) * Nd + v] = gr[std::int64_t(v) * D];
        }
        for (int u = 0; u < Uc; u += R) {
          const int nu = std::min(R, Uc - u);
          const T* a[R];
          for (int r = 0; r < R; ++r) a[r] = xl.data() + u + std::min(r, nu - 1);
          for (int v0 = 0; v0 < Nd; v0 += V) {
            const int nv = std::min(V, Nd - v0);
            T acc[R][V];
            micro_any<T, R, V>(tc, a, Uc, gl.data() + v0, Nd, nv, acc);
            for (int r = 0; r < nu; ++r) {
              T* o = out + std::int64_t(u + r) * ph.ks + v0;
              if (c0 == 0)
                for (int v = 0; v < nv; ++v) o[v] = c * acc[r][v];
              else
                for (int v = 0; v < nv; ++v) o[v] += c * acc[r][v];
            }
          }
        }
      }
    }
  }
}

}  // namespace

void SKIP_NS(apply)(bool is_double, const Tables& t, const Groups& g, const void* src, const void* w, void* dst,
                    int nthreads) {
  if (is_double)
    apply<double>(t, g, static_cast<const double*>(src), static_cast<const double*>(w), static_cast<double*>(dst),
                  nthreads);
  else
    apply<float>(t, g, static_cast<const float*>(src), static_cast<const float*>(w), static_cast<float*>(dst),
                 nthreads);
}

void SKIP_NS(wgrad)(bool is_double, const Tables& t, const Groups& g, const void* x, const void* gout, void* gw,
                    int nthreads) {
  if (is_double)
    wgrad<double>(t, g, static_cast<const double*>(x), static_cast<const double*>(gout), static_cast<double*>(gw),
                  nthreads);
  else
    wgrad<float>(t, g, static_cast<const float*>(x), static_cast<const float*>(gout), static_cast<float*>(gw),
                 nthreads);
}

}  // namespace skip_tp
}  // namespace cfm
