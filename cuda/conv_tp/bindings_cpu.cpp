// pybind11 bindings of the CPU conv TP kernels: raw pointers (tensor.data_ptr()) and sizes, no torch.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "conv_tp_host.h"

namespace py = pybind11;
using cfm::conv_tp::HostDescriptor;
using std::int64_t;
using std::uintptr_t;

namespace {

enum DType { kFloat32 = 0, kFloat64 = 1 };

template <typename T>
void run_segment(const HostDescriptor& d, int64_t n_nodes, uintptr_t ptr, uintptr_t perm, uintptr_t other,
                 uintptr_t node_in, int64_t din, uintptr_t y, int64_t dy, uintptr_t w, int64_t dw, uintptr_t out,
                 int64_t dout, int num_threads) {
  cfm::conv_tp::segment_accumulate<T>(d.view(), n_nodes, cfm::ptr<const int64_t>(ptr), cfm::ptr<const int64_t>(perm),
                                      cfm::ptr<const int64_t>(other), cfm::ptr<const T>(node_in), din,
                                      cfm::ptr<const T>(y), dy, cfm::ptr<const T>(w), dw, cfm::ptr<T>(out), dout,
                                      num_threads);
}

template <typename T>
void run_edge_grads(const HostDescriptor& d, int64_t n_edges, uintptr_t sender, uintptr_t receiver, uintptr_t x,
                    int64_t dx, uintptr_t g, int64_t dg, uintptr_t y, int64_t dy, uintptr_t w, int64_t dw,
                    uintptr_t gy, uintptr_t gw, int num_threads) {
  cfm::conv_tp::edge_grads<T>(d.view(), n_edges, cfm::ptr<const int64_t>(sender), cfm::ptr<const int64_t>(receiver),
                              cfm::ptr<const T>(x), dx, cfm::ptr<const T>(g), dg, cfm::ptr<const T>(y), dy,
                              cfm::ptr<const T>(w), dw, gy ? cfm::ptr<T>(gy) : nullptr,
                              gw ? cfm::ptr<T>(gw) : nullptr, num_threads);
}

}  // namespace

PYBIND11_MODULE(_C_conv_tp, m) {
  m.doc() = "cfm-plugins fused channelwise tensor product + scatter (CPU, OpenMP)";
  py::class_<HostDescriptor>(m, "Descriptor")
      .def(py::init<std::vector<int>, std::vector<int>, std::vector<int>, std::vector<int>, std::vector<int>,
                    std::vector<int>, std::vector<int>, std::vector<double>>(),
           py::arg("path_mul"), py::arg("path_woff"), py::arg("path_pair_start"), py::arg("pair_in"),
           py::arg("pair_out"), py::arg("pair_ent_start"), py::arg("ent_j"), py::arg("ent_coef"));

  m.def(
      "segment_accumulate",
      [](const HostDescriptor& d, int dtype, int64_t n_nodes, uintptr_t ptr, uintptr_t perm, uintptr_t other,
         uintptr_t node_in, int64_t din, uintptr_t y, int64_t dy, uintptr_t w, int64_t dw, uintptr_t out,
         int64_t dout, int num_threads) {
        py::gil_scoped_release nogil;
        if (dtype == kFloat32)
          run_segment<float>(d, n_nodes, ptr, perm, other, node_in, din, y, dy, w, dw, out, dout, num_threads);
        else if (dtype == kFloat64)
          run_segment<double>(d, n_nodes, ptr, perm, other, node_in, din, y, dy, w, dw, out, dout, num_threads);
        else
          throw std::invalid_argument("conv_tp: dtype code must be 0 (float32) or 1 (float64)");
      },
      "out[n] += sum over segment n's edges of the message from node_in[other[e]], y[e], w[e]");

  m.def(
      "edge_grads",
      [](const HostDescriptor& d, int dtype, int64_t n_edges, uintptr_t sender, uintptr_t receiver, uintptr_t x,
         int64_t dx, uintptr_t g, int64_t dg, uintptr_t y, int64_t dy, uintptr_t w, int64_t dw, uintptr_t gy,
         uintptr_t gw, int num_threads) {
        py::gil_scoped_release nogil;
        if (dtype == kFloat32)
          run_edge_grads<float>(d, n_edges, sender, receiver, x, dx, g, dg, y, dy, w, dw, gy, gw, num_threads);
        else if (dtype == kFloat64)
          run_edge_grads<double>(d, n_edges, sender, receiver, x, dx, g, dg, y, dy, w, dw, gy, gw, num_threads);
        else
          throw std::invalid_argument("conv_tp: dtype code must be 0 (float32) or 1 (float64)");
      },
      "per-edge gradients of the edge attributes (gy) and weights (gw); pass 0 to skip one");
}
