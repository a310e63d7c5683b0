// The Python module. torch/csrc/utils/pybind.h brings pybind11 with torch's tensor conversions in
// about 5 s of compile; torch/extension.h took about 20 s more.
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "kernel.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The GIL is released while a call runs: the window's thread keeps painting during a pass.
  // The classes are local to the module: the AVX-512 and AVX2 builds can be loaded side by side.
  using release = py::call_guard<py::gil_scoped_release>;
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dimension", release());
  m.def("linear", &linear, "low-bit linear: x [M, K] float32 -> [M, N] float32", release());
  m.def("rows", &rows, "dequantized weight rows for output indices", release());
  m.def("attention", &attention, "causal attention of n new rows over a cache, as the layer stack computes it",
        py::arg("queries"), py::arg("keys"), py::arg("values"), py::arg("start"), py::arg("scaling"),
        py::arg("window") = 0, py::arg("cap") = 0.0, release());
  m.attr("KEY_BLOCK") = kKeyBlock;
  m.def("swiglu", &swiglu_rows, "silu(gate) * up (gelu: tanh GELU) of [n, 2 * inner] rows, as the layer stack computes it",
        py::arg("gate_up"), py::arg("gelu") = false, release());
  py::class_<Projection>(m, "Projection", py::module_local())
      .def(py::init([](at::Tensor q, at::Tensor scale, at::Tensor min, at::Tensor scale_step, at::Tensor min_step,
                       at::Tensor values, std::optional<at::Tensor> bias, int64_t group, int64_t bits,
                       int64_t out_features) {
             return Projection{q, scale, min, scale_step, min_step, values, bias, group, bits, out_features};
           }),
           py::arg("q"), py::arg("scale"), py::arg("min"), py::arg("scale_step"), py::arg("min_step"),
           py::arg("values"), py::arg("bias"), py::arg("group"), py::arg("bits"), py::arg("out_features"));
  py::class_<Layer>(m, "Layer", py::module_local())
      .def(py::init([](at::Tensor input_norm, at::Tensor post_norm, std::vector<Projection> qkv, Projection output,
                       std::vector<Projection> gate_up, Projection down, std::optional<at::Tensor> q_norm,
                       std::optional<at::Tensor> k_norm, std::optional<at::Tensor> attention_out_norm,
                       std::optional<at::Tensor> feed_forward_out_norm, int64_t window) {
             return Layer{input_norm, post_norm, q_norm.value_or(at::Tensor()), k_norm.value_or(at::Tensor()),
                          std::move(qkv), output, std::move(gate_up), down,
                          attention_out_norm.value_or(at::Tensor()), feed_forward_out_norm.value_or(at::Tensor()),
                          window};
           }),
           py::arg("input_norm"), py::arg("post_norm"), py::arg("qkv"), py::arg("output"), py::arg("gate_up"),
           py::arg("down"), py::arg("q_norm") = py::none(), py::arg("k_norm") = py::none(),
           py::arg("attention_out_norm") = py::none(), py::arg("feed_forward_out_norm") = py::none(),
           py::arg("window") = 0);
  py::class_<LayerStack>(m, "LayerStack", py::module_local())
      .def(py::init<std::vector<Layer>, int64_t, int64_t, int64_t, double, double, bool, double>(), py::arg("layers"),
           py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("scaling"), py::arg("eps"),
           py::arg("gelu") = false, py::arg("cap") = 0.0)
      .def("forward", &LayerStack::forward, release(),
           "hidden [n, D] through every layer, writing the n new keys and values into the caches",
           py::arg("hidden"), py::arg("keys"), py::arg("values"), py::arg("cos"), py::arg("sin"), py::arg("start"),
           py::arg("local_cos") = py::none(), py::arg("local_sin") = py::none());
}
