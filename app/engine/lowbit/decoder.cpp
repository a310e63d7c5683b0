// The whole stack of Llama/Qwen2 decoder layers in one call: per layer RMSNorm, q/k/v
// projections, rotary embedding, the KV-cache write, causal attention, the output projection,
// RMSNorm and the SwiGLU MLP, with the residual adds. In Python the same layer is about 30 tensor
// operations whose dispatch cost (about 0.5 ms per layer on 2 cores) was a quarter of a low-bit
// draft's pass; here it is a loop over raw buffers.
//
// Attention is computed query row by query row, each over the keys up to its own position, with
// a fixed order of operations: a token verified inside a batch gets exactly the attention it gets
// when decoded alone (batch invariance, as for the linear layers), so greedy speculative output
// equals plain output bit for bit.
#include "kernel.h"
#include "vec16.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>
#include <vector>

namespace {

inline v16::Mask lanes(int64_t remaining) {
  if (remaining <= 0) return 0;
  return remaining >= 16 ? static_cast<v16::Mask>(0xFFFF) : static_cast<v16::Mask>((1u << remaining) - 1);
}

// Adds bias [width] to every row of out [n, width] in place.
void add_bias(at::Tensor& out, const at::Tensor& bias) {
  const int64_t n = out.size(0), width = out.size(1);
  float* dst = out.data_ptr<float>();
  const float* b = bias.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < width; c += 16) {
      const v16::Mask m = lanes(width - c);
      float* at = dst + r * width + c;
      v16::store(at, m, v16::add(v16::load(m, at), v16::load(m, b + c)));
    }
  }
}

// x [n, K] -> the concatenated outputs of `parts` [n, sum of out_features], biases added.
at::Tensor project(const at::Tensor& x, const std::vector<Projection>& parts) {
  if (parts.size() == 1 && parts[0].q.size(0) * 16 == parts[0].out_features) {  // 16 outputs per tile
    // One projection with no padding rows: its output is the result (copying it out, one value
    // at a time, had cost about 1.5 ms per pass per row verified on the default target).
    at::Tensor out = linear(x, parts[0].q, parts[0].scale, parts[0].min, parts[0].scale_step, parts[0].min_step,
                            parts[0].values, parts[0].group, parts[0].bits);
    if (parts[0].bias) add_bias(out, *parts[0].bias);
    return out;
  }
  int64_t width = 0;
  for (const Projection& p : parts) width += p.out_features;
  const int64_t n = x.size(0);
  at::Tensor out = at::empty({n, width}, at::kFloat);
  float* dst = out.data_ptr<float>();
  int64_t column = 0;
  for (const Projection& p : parts) {
    const at::Tensor y = linear(x, p.q, p.scale, p.min, p.scale_step, p.min_step, p.values, p.group, p.bits);
    const float* src = y.data_ptr<float>();
    const float* bias = p.bias ? p.bias->data_ptr<float>() : nullptr;
    const int64_t stride = y.size(1);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < p.out_features; ++c) {
        dst[r * width + column + c] = bias ? src[r * stride + c] + bias[c] : src[r * stride + c];
      }
    }
    column += p.out_features;
  }
  return out;
}

// Rotary embedding in place on `heads` consecutive vectors of one row (the rotate-half form
// transformers uses for Llama/Qwen2): x [heads, head_dim], cos/sin [head_dim].
void rotate(float* x, int64_t heads, int64_t head_dim, const float* cos, const float* sin) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const float first = v[i], second = v[i + half];
      v[i] = first * cos[i] - second * sin[i];
      v[i + half] = second * cos[i + half] + first * sin[i + half];
    }
  }
}

// e^x for x <= 0 (scores minus their maximum): 2^(x log2 e) split into an integer power and a
// polynomial of degree 7 on [-0.5, 0.5] (relative error about 2e-9 before float rounding).
inline v16::Vec exp_nonpositive(v16::Vec x) {
  x = v16::max(x, v16::set1(-87.f));
  const v16::Vec t = v16::mul(x, v16::set1(1.44269504088896341f));
  const v16::Vec whole = v16::round(t);
  const v16::Vec f = v16::sub(t, whole);
  constexpr float c[] = {1.f, 0.693147180559945f, 0.240226506959101f, 0.0555041086648216f,
                         0.00961812910762848f, 0.00133335581464284f, 0.000154035303933816f,
                         1.52527338040598e-05f};
  v16::Vec p = v16::set1(c[7]);
  for (int i = 6; i >= 0; --i) p = v16::fmadd(p, f, v16::set1(c[i]));
  return v16::scalef(p, whole);
}

// Zeroed accumulators for Blocks blocks of 16 lanes, and which lanes of each hold one of the
// `remaining` elements.
template <int64_t Blocks>
inline void start_blocks(v16::Vec* acc, v16::Mask* valid, int64_t remaining) {
  for (int64_t b = 0; b < Blocks; ++b) {
    acc[b] = v16::zero();
    valid[b] = lanes(remaining - 16 * b);
  }
}

constexpr int kMaxHeads = 4;        // query heads at a time: 16 accumulators in registers

// Calls f(std::integral_constant<int, heads>) for 1 <= heads <= kMaxHeads.
template <typename F>
void with_heads(int64_t heads, F&& f) {
  switch (heads) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    default: return f(std::integral_constant<int, 4>{});
  }
}

// Scaled scores q.k of H query heads of one row (queries [H, head_dim]) against the keys j0 ..
// j0 + 63 below `length`, into scores (H rows of `score_stride`), and each head's running
// 16-lane maximum `best` [H]. keys: a kv head's cache, blocks of kKeyBlock keys, each block
// transposed [head_dim, kKeyBlock] (row d holds component d of the block's keys): 16 keys' scores
// build up in one vector with no horizontal sums, and a block is one contiguous run of memory
// (transposing the whole cache instead had put each component of a block on its own page).
// Each key vector loaded feeds all H heads. Never inlined: each instantiation keeps its own
// register allocation (inlined, one spilled its accumulators on every key).
template <int H>
__attribute__((noinline)) void score_block(const float* queries, const float* keys, int64_t j0, int64_t length,
                                           int64_t head_dim, float scaling, float* scores, int64_t score_stride,
                                           v16::Vec* best) {
  constexpr int64_t kBlocks = kKeyBlock / 16;  // four independent FMA chains per head
  v16::Vec dot[H][kBlocks];
  v16::Mask valid[kBlocks];
  for (int h = 0; h < H; ++h) start_blocks<kBlocks>(dot[h], valid, length - j0);
  const float* block = keys + j0 * head_dim;  // j0 is a multiple of kKeyBlock
  for (int64_t d = 0; d < head_dim; ++d) {
    const float* row = block + d * kKeyBlock;
    v16::Vec key[kBlocks];
    for (int64_t b = 0; b < kBlocks; ++b) key[b] = v16::load(valid[b], row + 16 * b);
    for (int h = 0; h < H; ++h) {
      const v16::Vec q = v16::set1(queries[h * head_dim + d]);
      for (int64_t b = 0; b < kBlocks; ++b) dot[h][b] = v16::fmadd(q, key[b], dot[h][b]);
    }
  }
  for (int h = 0; h < H; ++h) {
    for (int64_t b = 0; b < kBlocks; ++b) {
      const v16::Vec scaled = v16::mul(dot[h][b], v16::set1(scaling));
      v16::store(scores + h * score_stride + j0 + 16 * b, valid[b], scaled);
      best[h] = v16::mask_max(best[h], valid[b], best[h], scaled);
    }
  }
}

// scores [length] -> e^(score - max) in place; returns 1 / their sum.
float exponentiate(float* scores, int64_t length, v16::Vec best) {
  const v16::Vec top = v16::set1(v16::reduce_max(best));
  v16::Vec total = v16::zero();
  for (int64_t j = 0; j < length; j += 16) {
    const v16::Mask m = lanes(length - j);
    const v16::Vec e = exp_nonpositive(v16::sub(v16::load(m, scores + j), top));
    v16::store(scores + j, m, e);
    total = v16::add(total, v16::maskz_mov(m, e));
  }
  return 1.f / v16::reduce_add(total);
}

// out [H, head_dim] += the weights (H rows of `score_stride`) of keys j0 .. end - 1 times their
// values ([length, head_dim] rows); out starts at zero when j0 is 0. Each value vector loaded
// feeds all H heads; every output sums over the keys in their order, block after block.
template <int H>
__attribute__((noinline)) void value_block(const float* weights, int64_t score_stride, const float* values, int64_t j0,
                                           int64_t end, int64_t head_dim, float* out) {
  constexpr int64_t kBlocks = 4;  // 64 components at a time, in registers
  for (int64_t d0 = 0; d0 < head_dim; d0 += 16 * kBlocks) {
    v16::Vec acc[H][kBlocks];
    v16::Mask valid[kBlocks];
    for (int h = 0; h < H; ++h) {
      start_blocks<kBlocks>(acc[h], valid, head_dim - d0);
      if (j0 > 0) {
        for (int64_t b = 0; b < kBlocks; ++b) acc[h][b] = v16::load(valid[b], out + h * head_dim + d0 + 16 * b);
      }
    }
    for (int64_t j = j0; j < end; ++j) {
      const float* row = values + j * head_dim + d0;
      v16::Vec value[kBlocks];
      for (int64_t b = 0; b < kBlocks; ++b) value[b] = v16::load(valid[b], row + 16 * b);
      for (int h = 0; h < H; ++h) {
        const v16::Vec weight = v16::set1(weights[h * score_stride + j]);
        for (int64_t b = 0; b < kBlocks; ++b) acc[h][b] = v16::fmadd(weight, value[b], acc[h][b]);
      }
    }
    for (int h = 0; h < H; ++h) {
      for (int64_t b = 0; b < kBlocks; ++b) v16::store(out + h * head_dim + d0 + 16 * b, valid[b], acc[h][b]);
    }
  }
}

// Rows first..last-1 of the query heads that read kv head g, over the cache: see causal_attention.
// Keys and values go block by block through every row's heads, so a verification reads the
// cache once rather than once per row (at 1,000 cached tokens re-reading it had made 4 rows' 
// attention cost 3.5 times one row's).
void attend_kv_head(const float* queries, int64_t q_stride, int64_t first, int64_t last, int64_t heads,
                    int64_t group, int64_t g, int64_t head_dim, const float* keys, const float* values,
                    int64_t start, float scaling, float* out) {
  const int64_t rows = last - first, stride = start + last;
  // Heads at a time: the group in near-even shares of at most kMaxHeads (6 as 3 + 3, not 4 + 2:
  // the loads of a share of 2 would feed only half as many products)
  const int64_t shares = (group + kMaxHeads - 1) / kMaxHeads, share = (group + shares - 1) / shares;
  std::vector<float> scores(rows * group * stride);
  std::vector<v16::Vec> best(rows * group, v16::set1(-INFINITY));
  // Query head h of row r (counted from `first`) within the group: its scores, its output
  const auto score_row = [&](int64_t r, int64_t h) { return scores.data() + (r * group + h) * stride; };
  const auto query = [&](int64_t r, int64_t h) { return queries + (first + r) * q_stride + (g * group + h) * head_dim; };
  const auto output = [&](int64_t r, int64_t h) { return out + ((first + r) * heads + g * group + h) * head_dim; };
  for (int64_t j0 = 0; j0 < stride; j0 += kKeyBlock) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t length = start + first + r + 1;
      for (int64_t h = 0; h < group && j0 < length; h += share) {
        with_heads(std::min(share, group - h), [&](auto n) {
          score_block<decltype(n)::value>(query(r, h), keys, j0, length, head_dim, scaling, score_row(r, h), stride,
                                          best.data() + r * group + h);
        });
      }
    }
  }
  std::vector<float> inverse(rows * group);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < group; ++h) inverse[r * group + h] = exponentiate(score_row(r, h), start + first + r + 1, best[r * group + h]);
  }
  for (int64_t j0 = 0; j0 < stride; j0 += kKeyBlock) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t end = std::min(j0 + kKeyBlock, start + first + r + 1);
      for (int64_t h = 0; h < group && j0 < end; h += share) {
        with_heads(std::min(share, group - h), [&](auto n) {
          value_block<decltype(n)::value>(score_row(r, h), stride, values, j0, end, head_dim, output(r, h));
        });
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < group; ++h) {
      float* o = output(r, h);
      const v16::Vec scale = v16::set1(inverse[r * group + h]);
      for (int64_t d = 0; d < head_dim; d += 16) {
        const v16::Mask m = lanes(head_dim - d);
        v16::store(o + d, m, v16::mul(v16::load(m, o + d), scale));
      }
    }
  }
}

// n query rows (row r at position start + r, its `heads` queries first in a row of `q_stride`
// floats) over the cache: out [n, heads * head_dim]. Keys [kv_heads, capacity / kKeyBlock,
// head_dim, kKeyBlock] (blocks of keys, each transposed), values [kv_heads, capacity, head_dim];
// query head h reads kv head h / (heads / kv_heads).
// Each query's scores and output sum in one fixed order (over d, then over keys) whatever n is,
// and the rows share each thread's reading of the cache.
void causal_attention(const float* queries, int64_t q_stride, int64_t n, int64_t heads, int64_t kv_heads,
                      int64_t head_dim, const float* key_cache, const float* value_cache, int64_t capacity,
                      int64_t start, float scaling, float* out) {
  const int64_t group = heads / kv_heads;
  // A task is one kv head's queries over all rows, or over one row when there are fewer kv
  // heads than threads (so that every thread has work).
  const int64_t row_tasks = kv_heads >= at::get_num_threads() ? 1 : n;
  at::parallel_for(0, kv_heads * row_tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / row_tasks, first = row_tasks == 1 ? 0 : task % row_tasks;
      const int64_t last = row_tasks == 1 ? n : first + 1;
      attend_kv_head(queries, q_stride, first, last, heads, group, g, head_dim, key_cache + g * head_dim * capacity,
                     value_cache + g * capacity * head_dim, start, scaling, out);
    }
  });
}

// SwiGLU's product silu(gate) * up for one row of `inner` values, 16 at a time: done one
// std::exp at a time it cost about 1 ms per verified row on the default target (8 rows: a tenth
// of the pass). silu(x) = x * sigmoid(x), and sigmoid is 1 / (1 + e) for x >= 0 and e / (1 + e)
// below, with e = exp(-|x|) <= 1, so the exponential never overflows.
void swiglu(const float* gate, const float* up, int64_t inner, float* out) {
  const v16::Vec one = v16::set1(1.f);
  for (int64_t i = 0; i < inner; i += 16) {
    const v16::Mask m = lanes(inner - i);
    const v16::Vec x = v16::load(m, gate + i);
    const v16::Vec e = exp_nonpositive(v16::sub(v16::zero(), v16::abs(x)));
    const v16::Vec inverse = v16::div(one, v16::add(one, e));
    const v16::Mask negative = v16::less_than(x, v16::zero());
    const v16::Vec sigmoid = v16::mask_mul(inverse, negative, e, inverse);
    v16::store(out + i, m, v16::mul(v16::mul(x, sigmoid), v16::load(m, up + i)));
  }
}

void add_into(float* dst, const at::Tensor& y) {
  const float* src = y.data_ptr<float>();
  for (int64_t i = 0; i < y.numel(); ++i) dst[i] += src[i];
}

}  // namespace

// The same attention on tensors, for tests: queries [n, heads, head_dim], keys and values
// [kv_heads, capacity, head_dim] holding start + n positions (the keys are laid out in blocks here).
at::Tensor attention(at::Tensor queries, at::Tensor keys, at::Tensor values, int64_t start, double scaling) {
  queries = queries.contiguous();
  values = values.contiguous();
  const int64_t n = queries.size(0), heads = queries.size(1), head_dim = queries.size(2);
  const int64_t kv_heads = keys.size(0), capacity = keys.size(1);
  TORCH_CHECK(keys.size(2) == head_dim && start + n <= capacity && values.sizes() == keys.sizes() &&
                  capacity % kKeyBlock == 0,
              "cache shapes do not match");
  const at::Tensor blocked = keys.view({kv_heads, capacity / kKeyBlock, kKeyBlock, head_dim}).transpose(2, 3).contiguous();
  at::Tensor out = at::empty({n, heads, head_dim}, at::kFloat);
  causal_attention(queries.data_ptr<float>(), heads * head_dim, n, heads, kv_heads, head_dim,
                   blocked.data_ptr<float>(), values.data_ptr<float>(), capacity, start, static_cast<float>(scaling),
                   out.data_ptr<float>());
  return out;
}

// gate_up [n, 2 * inner] (gate, then up) -> silu(gate) * up [n, inner], rows shared between threads.
at::Tensor swiglu_rows(at::Tensor gate_up) {
  gate_up = gate_up.contiguous();
  const int64_t n = gate_up.size(0), inner = gate_up.size(1) / 2;
  at::Tensor out = at::empty({n, inner}, at::kFloat);
  const float* gu = gate_up.data_ptr<float>();
  float* product = out.data_ptr<float>();
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) swiglu(gu + r * 2 * inner, gu + r * 2 * inner + inner, inner, product + r * inner);
  });
  return out;
}

at::Tensor LayerStack::forward(at::Tensor hidden, const std::vector<at::Tensor>& keys,
                               const std::vector<at::Tensor>& values, at::Tensor cos, at::Tensor sin, int64_t start) {
  TORCH_CHECK(keys.size() == layers_.size() && values.size() == layers_.size(), "one cache per layer");
  hidden = hidden.contiguous().clone();
  cos = cos.contiguous();
  sin = sin.contiguous();
  const int64_t n = hidden.size(0), hd = head_dim_;
  const int64_t q_width = heads_ * hd, kv_width = kv_heads_ * hd;
  TORCH_CHECK(keys[0].size(3) == kKeyBlock && keys[0].size(1) * kKeyBlock == values[0].size(1),
              "keys must be in blocks of kKeyBlock, as many as the values hold");
  TORCH_CHECK(start + n <= values[0].size(1), "the KV cache is too small");
  float* h = hidden.data_ptr<float>();
  for (size_t index = 0; index < layers_.size(); ++index) {
    const Layer& layer = layers_[index];
    at::Tensor qkv = project(rms_norm(hidden, layer.input_norm, eps_), layer.qkv);  // [n, q+k+v]
    float* qkv_ptr = qkv.data_ptr<float>();
    const int64_t capacity = values[index].size(1), qkv_width = qkv.size(1);
    float* key_cache = keys[index].data_ptr<float>();
    float* value_cache = values[index].data_ptr<float>();
    for (int64_t r = 0; r < n; ++r) {
      float* row = qkv_ptr + r * qkv_width;
      rotate(row, heads_, hd, cos.data_ptr<float>() + r * hd, sin.data_ptr<float>() + r * hd);
      rotate(row + q_width, kv_heads_, hd, cos.data_ptr<float>() + r * hd, sin.data_ptr<float>() + r * hd);
      for (int64_t g = 0; g < kv_heads_; ++g) {
        const float* key = row + q_width + g * hd;
        const int64_t position = start + r;
        float* block = key_cache + g * capacity * hd + (position / kKeyBlock) * hd * kKeyBlock;
        for (int64_t d = 0; d < hd; ++d) block[d * kKeyBlock + position % kKeyBlock] = key[d];
        std::copy_n(row + q_width + kv_width + g * hd, hd, value_cache + (g * capacity + start + r) * hd);
      }
    }
    at::Tensor attended = at::empty({n, q_width}, at::kFloat);
    causal_attention(qkv_ptr, qkv_width, n, heads_, kv_heads_, hd, key_cache, value_cache, capacity, start,
                     scaling_, attended.data_ptr<float>());
    add_into(h, project(attended, {layer.output}));
    at::Tensor gate_up = project(rms_norm(hidden, layer.post_norm, eps_), layer.gate_up);  // [n, 2I]
    add_into(h, project(swiglu_rows(gate_up), {layer.down}));
  }
  return hidden;
}
