// Counting neighbour pairs without listing them (see neighbours_cpu.h).
//
// Per structure: lattice vectors for the periodic directions (the others completed by unit
// vectors orthogonal to them), fractional coordinates, the atoms wrapped into the cell along the
// periodic directions, then "ghost" images of every atom whose fractional coordinate falls within
// the cutoff's margin of the cell (margin m_k = cutoff / plane spacing k). Every image within the
// cutoff of a real atom is then among the points, each once. A cell list over the points, with
// bins at least one cutoff thick along every lattice direction (so neighbours lie in the 27
// adjacent bins, in triclinic cells too), counts for every real atom the points closer than the
// cutoff, less itself. Coordinates are kept as separate x, y, z arrays in bin order so the inner
// loop vectorizes (AVX2 where the CPU has it: target_clones).
#include "neighbours_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define CFM_NB_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CFM_NB_CLONES
#endif

namespace cfm {
namespace neighbours {
namespace {

struct Work {
  std::vector<double> frac;            // [n, 3] wrapped fractional coordinates of the atoms
  std::vector<double> pf;              // [P, 3] fractional coordinates of atoms then images
  std::vector<int32_t> bin_of, start, order, fill;
  std::vector<double> x, y, z;         // Cartesian coordinates of the points, in bin order
};

double det3(const double* a) {
  return a[0] * (a[4] * a[8] - a[5] * a[7]) - a[1] * (a[3] * a[8] - a[5] * a[6]) +
         a[2] * (a[3] * a[7] - a[4] * a[6]);
}

// b = inverse of the row-major 3x3 a (det != 0).
void inv3(const double* a, double det, double* b) {
  const double d = 1.0 / det;
  b[0] = (a[4] * a[8] - a[5] * a[7]) * d;
  b[1] = (a[2] * a[7] - a[1] * a[8]) * d;
  b[2] = (a[1] * a[5] - a[2] * a[4]) * d;
  b[3] = (a[5] * a[6] - a[3] * a[8]) * d;
  b[4] = (a[0] * a[8] - a[2] * a[6]) * d;
  b[5] = (a[2] * a[3] - a[0] * a[5]) * d;
  b[6] = (a[3] * a[7] - a[4] * a[6]) * d;
  b[7] = (a[1] * a[6] - a[0] * a[7]) * d;
  b[8] = (a[0] * a[4] - a[1] * a[3]) * d;
}

void cross(const double* u, const double* v, double* w) {
  w[0] = u[1] * v[2] - u[2] * v[1];
  w[1] = u[2] * v[0] - u[0] * v[2];
  w[2] = u[0] * v[1] - u[1] * v[0];
}

bool normalize(double* v) {
  const double n = std::sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
  if (!(n > 0.0) || !std::isfinite(n)) return false;
  v[0] /= n, v[1] /= n, v[2] /= n;
  return true;
}

// The basis: the periodic rows of the cell, completed by unit vectors orthogonal to them. False
// where the periodic rows are linearly dependent (or zero).
bool basis(const double* cell, const bool* pbc, double* a) {
  int periodic[3], np = 0, free_[3], nf = 0;
  for (int k = 0; k < 3; ++k) (pbc[k] ? periodic[np++] : free_[nf++]) = k;
  for (int k = 0; k < 3; ++k)
    for (int c = 0; c < 3; ++c) a[3 * k + c] = pbc[k] ? cell[3 * k + c] : (c == k ? 1.0 : 0.0);
  if (np == 2) {  // the free direction: normal to the two periodic vectors
    cross(a + 3 * periodic[0], a + 3 * periodic[1], a + 3 * free_[0]);
    if (!normalize(a + 3 * free_[0])) return false;
  } else if (np == 1) {  // two unit vectors normal to the periodic one
    double u[3] = {a[3 * periodic[0]], a[3 * periodic[0] + 1], a[3 * periodic[0] + 2]};
    if (!normalize(u)) return false;
    double t[3] = {1.0, 0.0, 0.0};
    if (std::fabs(u[0]) > 0.9) t[0] = 0.0, t[1] = 1.0;
    double v[3], w[3];
    cross(u, t, v);
    normalize(v);
    cross(u, v, w);
    for (int c = 0; c < 3; ++c) a[3 * free_[0] + c] = v[c], a[3 * free_[1] + c] = w[c];
  }
  const double d = det3(a);
  double scale = 1.0;
  for (int k = 0; k < 3; ++k)
    if (pbc[k]) scale *= std::sqrt(a[3 * k] * a[3 * k] + a[3 * k + 1] * a[3 * k + 1] + a[3 * k + 2] * a[3 * k + 2]);
  return std::isfinite(d) && std::fabs(d) > 1e-12 * scale;
}

CFM_NB_CLONES
int64_t count_pairs(const Work& w, const int* nb, int64_t n, double rc2) {
  const double* __restrict X = w.x.data();
  const double* __restrict Y = w.y.data();
  const double* __restrict Z = w.z.data();
  int64_t count = 0;
  // the real atoms are points 0..n-1; order[] maps a bin-ordered slot back to its point
  for (int64_t t = 0; t < (int64_t)w.order.size(); ++t) {
    const int32_t p = w.order[t];
    if (p >= n) continue;
    const int b = w.bin_of[p];
    const int bz = b % nb[2], by = (b / nb[2]) % nb[1], bx = b / (nb[1] * nb[2]);
    const double xi = X[t], yi = Y[t], zi = Z[t];
    const int zlo = std::max(bz - 1, 0), zhi = std::min(bz + 1, nb[2] - 1);
    for (int dx = std::max(bx - 1, 0); dx <= std::min(bx + 1, nb[0] - 1); ++dx)
      for (int dy = std::max(by - 1, 0); dy <= std::min(by + 1, nb[1] - 1); ++dy) {
        const int row = (dx * nb[1] + dy) * nb[2];
        const int s = w.start[row + zlo], e = w.start[row + zhi + 1];
        int64_t c = 0;
        for (int u = s; u < e; ++u) {
          const double ddx = X[u] - xi, ddy = Y[u] - yi, ddz = Z[u] - zi;
          c += (ddx * ddx + ddy * ddy + ddz * ddz < rc2) ? 1 : 0;
        }
        count += c;
      }
    count -= 1;  // the atom itself
  }
  return count;
}

int64_t count_one(const double* pos, int64_t n, const double* cell, const bool* pbc, double rc,
                  Work& w) {
  if (n <= 0) return 0;
  double a[9], inv[9];
  if (!basis(cell, pbc, a)) return kDegenerateCell;
  inv3(a, det3(a), inv);
  double margin[3];  // the cutoff in fractional units of each lattice direction
  for (int k = 0; k < 3; ++k)
    margin[k] = rc * std::sqrt(inv[k] * inv[k] + inv[3 + k] * inv[3 + k] + inv[6 + k] * inv[6 + k]);
  w.frac.resize(3 * n);
  double lo[3] = {INFINITY, INFINITY, INFINITY}, hi[3] = {-INFINITY, -INFINITY, -INFINITY};
  for (int64_t i = 0; i < n; ++i) {
    const double* r = pos + 3 * i;
    for (int k = 0; k < 3; ++k) {
      double f = r[0] * inv[k] + r[1] * inv[3 + k] + r[2] * inv[6 + k];
      if (pbc[k]) {
        f -= std::floor(f);
        if (f >= 1.0) f = 0.0;  // -tiny wraps to 1.0 in floating point
      }
      w.frac[3 * i + k] = f;
      lo[k] = std::min(lo[k], f);
      hi[k] = std::max(hi[k], f);
    }
  }
  int reach[3] = {0, 0, 0};
  double images = 1.0;
  for (int k = 0; k < 3; ++k)
    if (pbc[k]) {
      lo[k] = -margin[k], hi[k] = 1.0 + margin[k];
      reach[k] = (int)std::ceil(margin[k]) + 1;
      images *= 1.0 + 2.0 * margin[k];
    }
  if (images * (double)n > (double)kMaxPoints) return kTooManyImages;
  // the points: the atoms, then their images inside [lo, hi]
  w.pf.assign(w.frac.begin(), w.frac.end());
  for (int64_t i = 0; i < n; ++i) {
    const double* f = &w.frac[3 * i];
    for (int sa = -reach[0]; sa <= reach[0]; ++sa) {
      const double fx = f[0] + sa;
      if (fx < lo[0] || fx > hi[0]) continue;
      for (int sb = -reach[1]; sb <= reach[1]; ++sb) {
        const double fy = f[1] + sb;
        if (fy < lo[1] || fy > hi[1]) continue;
        for (int sc = -reach[2]; sc <= reach[2]; ++sc) {
          if (sa == 0 && sb == 0 && sc == 0) continue;
          const double fz = f[2] + sc;
          if (fz < lo[2] || fz > hi[2]) continue;
          w.pf.push_back(fx), w.pf.push_back(fy), w.pf.push_back(fz);
        }
      }
    }
  }
  const int64_t points = (int64_t)w.pf.size() / 3;
  // bins at least one cutoff thick along each lattice direction, no more than ~2 per point
  int nb[3];
  double scale[3];
  for (int k = 0; k < 3; ++k) {
    const double extent = hi[k] - lo[k];
    const double bins = margin[k] > 0 ? std::floor(extent / margin[k]) : 1.0;
    nb[k] = (int)std::max(1.0, std::min(bins, 4096.0));
  }
  while ((int64_t)nb[0] * nb[1] * nb[2] > 2 * points + 27) {
    const int k = (nb[0] >= nb[1] && nb[0] >= nb[2]) ? 0 : (nb[1] >= nb[2] ? 1 : 2);
    nb[k] = std::max(1, nb[k] / 2);
  }
  for (int k = 0; k < 3; ++k) {
    const double extent = hi[k] - lo[k];
    scale[k] = extent > 0 ? nb[k] / extent : 0.0;
  }
  const int total = nb[0] * nb[1] * nb[2];
  w.bin_of.resize(points);
  w.start.assign(total + 1, 0);
  for (int64_t p = 0; p < points; ++p) {
    int idx[3];
    for (int k = 0; k < 3; ++k) {
      const int v = (int)((w.pf[3 * p + k] - lo[k]) * scale[k]);
      idx[k] = std::min(std::max(v, 0), nb[k] - 1);
    }
    const int b = (idx[0] * nb[1] + idx[1]) * nb[2] + idx[2];
    w.bin_of[p] = b;
    w.start[b + 1]++;
  }
  for (int b = 0; b < total; ++b) w.start[b + 1] += w.start[b];
  w.fill.assign(w.start.begin(), w.start.end() - 1);
  w.order.resize(points);
  w.x.resize(points), w.y.resize(points), w.z.resize(points);
  for (int64_t p = 0; p < points; ++p) {
    const int t = w.fill[w.bin_of[p]]++;
    w.order[t] = (int32_t)p;
    const double* f = &w.pf[3 * p];
    w.x[t] = f[0] * a[0] + f[1] * a[3] + f[2] * a[6];
    w.y[t] = f[0] * a[1] + f[1] * a[4] + f[2] * a[7];
    w.z[t] = f[0] * a[2] + f[1] * a[5] + f[2] * a[8];
  }
  return count_pairs(w, nb, n, rc * rc);
}

}  // namespace

void count_edges_cpu(const double* positions, const int64_t* offsets, int64_t num_structures,
                     const double* cells, const uint8_t* pbc, double cutoff, int64_t* out,
                     int threads) {
#pragma omp parallel num_threads(std::max(threads, 1)) if (threads > 1 && num_structures > 64)
  {
    Work w;
#pragma omp for schedule(dynamic, 16)
    for (int64_t s = 0; s < num_structures; ++s) {
      const bool p[3] = {pbc[3 * s] != 0, pbc[3 * s + 1] != 0, pbc[3 * s + 2] != 0};
      out[s] = count_one(positions + 3 * offsets[s], offsets[s + 1] - offsets[s], cells + 9 * s, p,
                         cutoff, w);
    }
  }
}

}  // namespace neighbours
}  // namespace cfm
