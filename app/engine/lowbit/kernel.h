// Shared between kernel.cpp (the low-bit linear layer), decoder.cpp (the layer stack) and
// bindings.cpp (the Python module). Only ATen's core headers: torch/extension.h alone took about
// 20 s of each file's compile (the kernel is built on a first start, on the user's cores).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <utility>
#include <vector>

// x [M, K] float32 -> [M, N] float32 (N: the packed weight's padded outputs)
at::Tensor linear(at::Tensor x, at::Tensor q, at::Tensor scale, at::Tensor min, at::Tensor scale_step,
                  at::Tensor min_step, at::Tensor values, int64_t group, int64_t bits);
// The float rows of the weight for the given output indices (embedding lookup): [len(ids), K].
at::Tensor rows(at::Tensor ids, at::Tensor q, at::Tensor scale, at::Tensor min, at::Tensor scale_step,
                at::Tensor min_step, at::Tensor values, int64_t group, int64_t bits);
// x [..., D] float32 -> RMS-normalised rows times weight [D]
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps);
// What RMSNorm multiplies one row [d] by (before the weight): 1 / sqrt(mean(x^2) + eps).
float rms_scale(const float* row, int64_t d, double eps);
// Keys the layer stack's cache holds in one block (transposed: [head_dim, kKeyBlock]).
constexpr int64_t kKeyBlock = 64;
// Causal attention of n new rows over a cache, as the layer stack computes it (for tests):
// queries [n, heads, head_dim], keys and values [kv_heads, capacity, head_dim] holding start + n
// positions (capacity a multiple of kKeyBlock), float32 or float16.
at::Tensor attention(at::Tensor queries, at::Tensor keys, at::Tensor values, int64_t start, double scaling,
                     int64_t window, double cap);
// The layer stack's silu(gate) * up (exposed for tests): gate_up [n, 2 * inner] -> [n, inner].
at::Tensor swiglu_rows(at::Tensor gate_up, bool gelu);

// One low-bit projection: its packed weight (see kernel.cpp), its real outputs and its bias.
struct Projection {
  at::Tensor q, scale, min, scale_step, min_step, values;
  std::optional<at::Tensor> bias;  // float32 [out_features]
  int64_t group, bits, out_features;
};

// What the layer stack (decoder.cpp) shares with the kernel (kernel.cpp): the packed weight's
// parameters as raw pointers, checked once, and the kernel's two steps on caller-owned buffers
// for the outputs and activation groups one thread takes.
constexpr int64_t kTile = 16;  // outputs per tile

// How a packed weight stores its groups' parameters (see check_params).
struct Format {
  bool coded;      // int8 codes times float16 steps (else float16 per group)
  bool symmetric;  // no min stored: w = scale * (value - 2^(value bits - 1))
  bool mapped;     // 4-bit integers stand for 8-bit values from a table
};

// Where one tile's group scales and mins live.
struct TileParams {
  const void* scale;  // [groups, 16]: float16 (plain) or int8 codes
  const void* min;    // as scale; unused when symmetric
  const at::Half* scale_step;  // [super-blocks, 16] float16 (coded only)
  const at::Half* min_step;
  const uint8_t* values;  // [16]: what each 4-bit integer stands for (mapped only)
};

// The parameters of one packed weight as raw pointers, for any of its tiles.
struct WeightParams {
  const uint8_t* scale;  // bytes, float16 or int8 elements
  const uint8_t* min;
  const at::Half* scale_step;
  const at::Half* min_step;
  const uint8_t* values;
  int64_t param_bytes, groups, steps;  // element size of scale/min; groups and super-blocks per tile row
  int64_t per_step;  // groups per super-block (all of them when there are no steps: plain)

  WeightParams(const at::Tensor& scale_t, const at::Tensor& min_t, const at::Tensor& scale_step_t,
               const at::Tensor& min_step_t, const at::Tensor& values_t)
      : scale(static_cast<const uint8_t*>(scale_t.data_ptr())),
        min(min_t.numel() ? static_cast<const uint8_t*>(min_t.data_ptr()) : nullptr),
        scale_step(scale_step_t.numel() ? scale_step_t.data_ptr<at::Half>() : nullptr),
        min_step(min_step_t.numel() ? min_step_t.data_ptr<at::Half>() : nullptr),
        values(values_t.numel() ? values_t.data_ptr<uint8_t>() : nullptr),
        param_bytes(scale_t.element_size()), groups(scale_t.size(1)), steps(scale_step_t.size(1)),
        per_step(steps ? groups / steps : groups) {}

  TileParams tile(int64_t t) const {
    const int64_t at = t * groups * kTile * param_bytes, step_at = t * steps * kTile;
    return {scale + at, min ? min + at : nullptr, scale_step ? scale_step + step_at : nullptr,
            min_step ? min_step + step_at : nullptr, values ? values + t * kTile : nullptr};
  }
};

// One block of activation rows, quantized: int8 values [rows, k], and per row and group the
// int8 step, the step times the group's sum and the sum itself.
struct Activations {
  const int8_t* q;
  const float* step;
  const float* scaled_sum;
  const int32_t* sum;
  int64_t k;

  // The block of rows that starts at row r0 (of `groups` groups each).
  Activations from_row(int64_t r0, int64_t groups) const {
    return {q + r0 * k, step + r0 * groups, scaled_sum + r0 * groups, sum + r0 * groups, k};
  }
};

// Where quantize_groups writes: int8 values [rows, k], and per row and group (k / group of them)
// the step, the step times the group's sum, and the sum.
struct QuantizedView {
  int8_t* q;
  float* step;
  float* scaled_sum;
  int32_t* sum;
  int64_t k;

  Activations activations() const { return {q, step, scaled_sum, sum, k}; }
};

// Quantizes groups begin .. end - 1 of x [rows, k] (group i: row i / (k / group), inputs
// (i % (k / group)) * group onwards) to int8, each group symmetric with its own step.
void quantize_groups(const float* x, int64_t group, int64_t begin, int64_t end, const QuantizedView& out);

// One projection's packed weight as the kernel reads it (see kernel.cpp's layout), checked once.
struct PreparedWeight {
  Format format;  // first: checking the parameters comes before reading them
  const uint8_t* q;
  int64_t tile_bytes, pairs;  // pairs of 16-output tiles
  WeightParams params;
  int64_t group, bits;

  explicit PreparedWeight(const Projection& p);
};

// Output tiles 2 * first .. 2 * end - 1 of `rows` activation rows: out [rows, out_stride] gets
// their columns 32 * first onwards.
void pair_range(const PreparedWeight& w, const Activations& act, int64_t rows, int64_t first, int64_t end, float* out,
                int64_t out_stride);

// This thread's share of `count` items: an even split in order, as at::parallel_for makes it.
inline std::pair<int64_t, int64_t> share(int64_t count, int thread, int threads) {
  const int64_t chunk = (count + threads - 1) / threads;
  return {std::min(count, thread * chunk), std::min(count, (thread + 1) * chunk)};
}

// The tile pairs of one matrix a thread of a team has still to do: front in the low 32 bits, end
// in the high 32 bits.
using PairRange = std::atomic<uint64_t>;

// Sets each thread's share of `pairs` tile pairs: ranges [threads] (by one thread, before a barrier).
void share_pairs(int64_t pairs, PairRange* ranges, int threads);

// Calls products(first, end) for runs of tile pairs until none are left: this thread's own share
// front to back, in runs of consecutive pairs (the weights stream in order, which the kernel's
// prefetching expects), then single pairs from the back of the others' shares. An even split
// alone had kept the faster core waiting for the slower (the cores' speeds differ from moment to
// moment); pairs handed out a run at a time from one counter broke each thread's stream of
// weights (the draft 4% slower). Which thread computes a pair changes nothing in its arithmetic.
template <typename Products>
void take_pairs(PairRange* ranges, int thread, int threads, int64_t pairs, Products&& products) {
  const auto take = [&](PairRange& range, bool own) {
    const int64_t run = own ? std::max<int64_t>(1, pairs / (16 * threads)) : 1;
    uint64_t seen = range.load();
    for (;;) {
      // Runs shrink to half of what is left near the end of a share: the thread that runs out first
      // then waits for at most about one pair of the other's, not a whole run.
      const int64_t front = seen & 0xFFFFFFFF, end = seen >> 32;
      if (end <= front) return;
      const int64_t count = std::min(run, std::max<int64_t>(1, (end - front) / 2));
      const int64_t first = own ? front : end - count;
      const uint64_t left = own ? static_cast<uint64_t>(end) << 32 | (front + count)
                                : static_cast<uint64_t>(end - count) << 32 | front;
      if (range.compare_exchange_weak(seen, left)) {
        products(first, first + count);
        seen = range.load();
      }
    }
  };
  take(ranges[thread], true);
  for (int other = 1; other < threads; ++other) take(ranges[(thread + other) % threads], false);
}

struct Layer {
  at::Tensor input_norm, post_norm;  // float32 [D]: before attention, before the feed-forward layer
  // Qwen3's and Gemma 3's RMSNorm of each query and key head before the rotary embedding: float32
  // [head_dim], or empty tensors (Llama, Qwen2)
  at::Tensor q_norm, k_norm;
  std::vector<Projection> qkv;      // one fused projection, or q, k and v
  Projection output;
  std::vector<Projection> gate_up;  // one fused projection, or gate and up
  Projection down;
  // Gemma 3's RMSNorm of the attention's and the feed-forward layer's outputs before each is added
  // to the residual stream: float32 [D], or empty tensors
  at::Tensor attention_out_norm, feed_forward_out_norm;
  // A local layer's sliding window (Gemma 2 and 3): each row attends over its last `window` keys,
  // itself included, with the local rotary embedding where one is given (Gemma 3); 0: a global
  // layer (every key up to the row)
  int64_t window = 0;
};

// A projection as the layer stack runs it: its weight, bias and outputs, and where those go in
// the row its step writes (q, k and v side by side; gate and up), padded or not.
struct Part {
  PreparedWeight weight;
  const float* bias;  // [out_features] or null
  int64_t out_features;
  int64_t column;         // of its first output in the step's row of real outputs
  int64_t padded_column;  // the same in the step's row of padded outputs (2 * pairs * 16 each)
};

// One step's projections of the same input: all of a layer's q/k/v, its output projection,
// gate/up or down.
struct Step {
  std::vector<Part> parts;
  int64_t width = 0, padded_width = 0;  // real and padded outputs of all parts
  int64_t input = 0;                    // the input's width (K)
  bool groups[2] = {false, false};      // which group sizes (16, 32) its parts take activations in
};

// The whole stack of Llama/Qwen2/Qwen3/Gemma 2/Gemma 3 decoder layers in one call (decoder.cpp).
class LayerStack {
 public:
  // gelu: the feed-forward layers are GeGLU with tanh GELU (Gemma) instead of SwiGLU; cap: the
  // attention scores' soft cap, cap * tanh(score / cap) (Gemma 2; 0: none)
  LayerStack(std::vector<Layer> layers, int64_t heads, int64_t kv_heads, int64_t head_dim, double scaling,
             double eps, bool gelu, double cap);

  // hidden [n, D] float32 -> [n, D] after every layer. Per layer float16 (or float32) caches
  // holding `start` tokens: keys [kv_heads, capacity / kKeyBlock, head_dim, kKeyBlock] (blocks of keys, each
  // transposed), values [kv_heads, capacity, head_dim];
  // this call writes positions start..start+n-1. cos/sin [n, head_dim]: the rotary embedding of
  // those positions; local_cos/local_sin the same for local layers where theirs differ (Gemma 3).
  at::Tensor forward(at::Tensor hidden, const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values,
                     at::Tensor cos, at::Tensor sin, int64_t start, std::optional<at::Tensor> local_cos,
                     std::optional<at::Tensor> local_sin);

 private:
  struct Steps {
    Step qkv, output, gate_up, down;
  };
  std::vector<Layer> layers_;  // owns the tensors steps_ point into
  std::vector<Steps> steps_;
  // The widest step input, padded step output and feed-forward width of all layers: what a
  // pass's buffers hold per row.
  int64_t widest_input_ = 0, widest_padded_ = 0, widest_inner_ = 0;
  int64_t heads_, kv_heads_, head_dim_;
  float scaling_, cap_;
  double eps_;
  bool gelu_;
};
