// gemm_rm (conv_tp_host.h): the row-major GEMM of the radial conv TP kernels. torch's x86 builds
// export MKL's Fortran sgemm_/dgemm_ (and MKL_Set_Num_Threads_Local); they are declared weak, so a
// torch without them (another BLAS, another platform) loads this library and takes the plain
// loops below.
#include <algorithm>
#include <climits>

#include "conv_tp_host.h"

extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*) __attribute__((weak));
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*,
            const int*, const double*, const int*, const double*, double*, const int*) __attribute__((weak));
int MKL_Set_Num_Threads_Local(int) __attribute__((weak));  // MKL's C interface
}

namespace cfm {
namespace conv_tp {
namespace {

template <typename T>
using Blas = void (*)(const char*, const char*, const int*, const int*, const int*, const T*, const T*, const int*,
                      const T*, const int*, const T*, T*, const int*);

template <typename T>
Blas<T> blas();
template <>
Blas<float> blas<float>() { return &sgemm_ ? &sgemm_ : nullptr; }
template <>
Blas<double> blas<double>() { return &dgemm_ ? &dgemm_ : nullptr; }

bool fits_int(std::int64_t v) { return v >= 0 && v <= INT_MAX; }

}  // namespace

template <typename T>
void gemm_rm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const T* A, std::int64_t lda,
             const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  const auto f = blas<T>();
  if (f && k > 0 && fits_int(m) && fits_int(n) && fits_int(k) && fits_int(lda) && fits_int(ldb) && fits_int(ldc)) {
    // row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the operands swap
    const int M = static_cast<int>(n), N = static_cast<int>(m), Kk = static_cast<int>(k);
    const int LA = static_cast<int>(ldb), LB = static_cast<int>(lda), LC = static_cast<int>(ldc);
    const char tA = tb ? 'T' : 'N', tB = ta ? 'T' : 'N';
    const T one = T(1);
    // one thread per call, inside or outside the kernels' parallel regions: the same result
    // whatever the thread count, and no second team on the cores the kernel already uses
    const int previous = MKL_Set_Num_Threads_Local ? MKL_Set_Num_Threads_Local(1) : 0;
    f(&tA, &tB, &M, &N, &Kk, &one, B, &LA, A, &LB, &beta, C, &LC);
    if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(previous);
    return;
  }
  for (std::int64_t i = 0; i < m; ++i) {
    T* c = C + i * ldc;
    if (beta == T(0))
      std::fill(c, c + n, T(0));
    else if (beta != T(1))
      for (std::int64_t j = 0; j < n; ++j) c[j] *= beta;
    for (std::int64_t p = 0; p < k; ++p) {
      const T a = ta ? A[p * lda + i] : A[i * lda + p];
      if (tb)
        for (std::int64_t j = 0; j < n; ++j) c[j] += a * B[j * ldb + p];
      else
        for (std::int64_t j = 0; j < n; ++j) c[j] += a * B[p * ldb + j];
    }
  }
}

template void gemm_rm<float>(bool, bool, std::int64_t, std::int64_t, std::int64_t, const float*, std::int64_t,
                             const float*, std::int64_t, float, float*, std::int64_t);
template void gemm_rm<double>(bool, bool, std::int64_t, std::int64_t, std::int64_t, const double*, std::int64_t,
                              const double*, std::int64_t, double, double*, std::int64_t);

}  // namespace conv_tp
}  // namespace cfm
