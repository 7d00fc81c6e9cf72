// pybind11 bindings of the CUDA conv TP kernels: raw device pointers, sizes and the stream as ints.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "conv_tp_cuda.h"

namespace py = pybind11;
namespace gpu = cfm::conv_tp::gpu;
using std::int64_t;
using std::uintptr_t;

namespace {

struct Descriptor {  // owns the device copy of the tables
  std::unique_ptr<gpu::DeviceDescriptor, void (*)(gpu::DeviceDescriptor*)> d{nullptr, gpu::destroy_descriptor};
  Descriptor(std::vector<int> a, std::vector<int> b, std::vector<int> c, std::vector<int> e, std::vector<int> f,
             std::vector<int> g, std::vector<int> h, std::vector<double> coef)
      : d(gpu::create_descriptor(a, b, c, e, f, g, h, coef), gpu::destroy_descriptor) {}
};

}  // namespace

PYBIND11_MODULE(_C_conv_tp_cuda, m) {
  m.doc() = "cfm-plugins fused channelwise tensor product + scatter (CUDA)";
  py::class_<Descriptor>(m, "Descriptor")
      .def(py::init<std::vector<int>, std::vector<int>, std::vector<int>, std::vector<int>, std::vector<int>,
                    std::vector<int>, std::vector<int>, std::vector<double>>(),
           py::arg("path_mul"), py::arg("path_woff"), py::arg("path_pair_start"), py::arg("pair_in"),
           py::arg("pair_out"), py::arg("pair_ent_start"), py::arg("ent_j"), py::arg("ent_coef"));
  m.def(
      "segment_accumulate",
      [](const Descriptor& d, int dtype, int64_t n_nodes, uintptr_t ptr, uintptr_t perm, uintptr_t other,
         uintptr_t node_in, int64_t din, uintptr_t y, int64_t dy, uintptr_t w, int64_t dw, uintptr_t out,
         int64_t dout, uintptr_t stream) {
        py::gil_scoped_release nogil;
        gpu::segment_accumulate(d.d.get(), dtype, n_nodes, ptr, perm, other, node_in, din, y, dy, w, dw, out, dout,
                                stream);
      },
      "out[n] += sum over segment n's edges of the message from node_in[other[e]], y[e], w[e] (async on stream)");
  m.def(
      "edge_grads",
      [](const Descriptor& d, int dtype, int64_t n_edges, uintptr_t sender, uintptr_t receiver, uintptr_t x,
         int64_t dx, uintptr_t g, int64_t dg, uintptr_t y, int64_t dy, uintptr_t w, int64_t dw, uintptr_t gy,
         uintptr_t gw, uintptr_t stream) {
        py::gil_scoped_release nogil;
        gpu::edge_grads(d.d.get(), dtype, n_edges, sender, receiver, x, dx, g, dg, y, dy, w, dw, gy, gw, stream);
      },
      "per-edge gradients of the edge attributes (gy) and weights (gw); pass 0 to skip one (async on stream)");
}
