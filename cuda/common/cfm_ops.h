// What every cfm::<kernel>_<pass> torch operator shares (CPU and CUDA registrations alike).
//
// The kernels themselves (*_cpu.cpp, *.cu) never include torch headers: they take raw pointers and
// sizes. Each kernel's <kernel>_ops.h is the ONE binding layer: it checks the tensors, unpacks the
// descriptor (a list of tensors plus a list of ints, built by cfm_plugins/ops/descriptors/) into the
// kernel's argument struct once, allocates the outputs, and calls a Runner: CpuRunner below, or
// the CUDA one in <kernel>_ops_cuda.cpp. Autograd (C++ torch::autograd::Function) and the Meta
// kernels (shapes only, for torch.compile / torch.export fake tensors) are registered beside them,
// so a scripted or exported model differentiates (forces) without Python.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cstdint>
#include <string>

#include "cfm_common.h"

namespace cfm {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Data pointer of a tensor, or nullptr for an undefined/empty one ("not requested").
template <typename T>
inline T* data_or_null(const Tensor& t) {
  return (t.defined() && t.numel() > 0) ? static_cast<T*>(t.data_ptr()) : nullptr;
}

inline void check_float(const char* op, const Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, op, ": ", name,
              " must be float32 or float64, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

inline void check_index(const char* op, const Tensor& t, const char* name, at::ScalarType type) {
  TORCH_CHECK(t.scalar_type() == type, op, ": ", name, " must be ", type, ", got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

inline void check_same(const char* op, const Tensor& ref, const Tensor& t, const char* name) {
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " is on ", t.device(), ", expected ", ref.device());
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " is ", t.scalar_type(), ", expected ",
              ref.scalar_type());
}

// An empty tensor standing for "this gradient was not requested".
inline Tensor none_like(const Tensor& t) { return at::empty({0}, t.options()); }

// Runs CPU kernels with torch's intra-op thread count (OpenMP inside the kernels).
struct CpuRunner {
  static int threads() { return at::get_num_threads(); }
};

// Below-autograd call of an operator through the dispatcher (the Autograd kernels use it).
inline c10::OperatorHandle op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

}  // namespace cfm

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace cfm {

// The current CUDA device's current stream as an integer (for the *_cuda.h entry points), through
// c10's device-generic guard: the CUDA registrations need no ATen CUDA headers or libraries.
// Call it under a device guard for the tensors' device.
inline std::uintptr_t current_cuda_stream() {
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  return reinterpret_cast<std::uintptr_t>(impl.getStream(impl.getDevice()).native_handle());
}

}  // namespace cfm
