// Shared between kernel.cpp (the low-bit linear layer), decoder.cpp (the layer stack) and
// bindings.cpp (the Python module). Only ATen's core headers: torch/extension.h alone took about
// 20 s of each file's compile (the kernel is built on a first start, on the user's cores).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

// x [M, K] float32 -> [M, N] float32 (N: the packed weight's padded outputs)
at::Tensor linear(at::Tensor x, at::Tensor q, at::Tensor scale, at::Tensor min, at::Tensor scale_step,
                  at::Tensor min_step, at::Tensor values, int64_t group, int64_t bits);
// The float rows of the weight for the given output indices (embedding lookup): [len(ids), K].
at::Tensor rows(at::Tensor ids, at::Tensor q, at::Tensor scale, at::Tensor min, at::Tensor scale_step,
                at::Tensor min_step, at::Tensor values, int64_t group, int64_t bits);
// x [..., D] float32 -> RMS-normalised rows times weight [D]
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps);
// Keys the layer stack's cache holds in one block (transposed: [head_dim, kKeyBlock]).
constexpr int64_t kKeyBlock = 64;
// Causal attention of n new rows over a cache, as the layer stack computes it (for tests):
// queries [n, heads, head_dim], keys and values [kv_heads, capacity, head_dim] holding start + n
// positions (capacity a multiple of kKeyBlock).
at::Tensor attention(at::Tensor queries, at::Tensor keys, at::Tensor values, int64_t start, double scaling);
// The layer stack's silu(gate) * up (exposed for tests): gate_up [n, 2 * inner] -> [n, inner].
at::Tensor swiglu_rows(at::Tensor gate_up);

// One low-bit projection: its packed weight (see kernel.cpp), its real outputs and its bias.
struct Projection {
  at::Tensor q, scale, min, scale_step, min_step, values;
  std::optional<at::Tensor> bias;  // float32 [out_features]
  int64_t group, bits, out_features;
};

struct Layer {
  at::Tensor input_norm, post_norm;  // float32 [D]
  std::vector<Projection> qkv;      // one fused projection, or q, k and v
  Projection output;
  std::vector<Projection> gate_up;  // one fused projection, or gate and up
  Projection down;
};

// The whole stack of Llama/Qwen2 decoder layers in one call (decoder.cpp).
class LayerStack {
 public:
  LayerStack(std::vector<Layer> layers, int64_t heads, int64_t kv_heads, int64_t head_dim, double scaling,
             double eps)
      : layers_(std::move(layers)), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim),
        scaling_(static_cast<float>(scaling)), eps_(eps) {}

  // hidden [n, D] float32 -> [n, D] after every layer. Per layer float32 caches holding `start`
  // tokens: keys [kv_heads, capacity / kKeyBlock, head_dim, kKeyBlock] (blocks of keys, each
  // transposed), values [kv_heads, capacity, head_dim];
  // this call writes positions start..start+n-1. cos/sin [n, head_dim]: the rotary embedding of
  // those positions.
  at::Tensor forward(at::Tensor hidden, const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values,
                     at::Tensor cos, at::Tensor sin, int64_t start);

 private:
  std::vector<Layer> layers_;
  int64_t heads_, kv_heads_, head_dim_;
  float scaling_;
  double eps_;
};
