// Shared between kernel.cpp (the low-bit linear layer) and decoder.cpp (the layer stack).
#pragma once

#include <torch/extension.h>

// x [M, K] float32 -> [M, N] float32 (N: the packed weight's padded outputs)
torch::Tensor linear(torch::Tensor x, torch::Tensor q, torch::Tensor scale, torch::Tensor min, torch::Tensor scale_step,
                     torch::Tensor min_step, int64_t group, int64_t bits);
// x [..., D] float32 -> RMS-normalised rows times weight [D]
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
// Registers the decoder's classes (decoder.cpp) on the extension module.
void bind_decoder(pybind11::module& m);
