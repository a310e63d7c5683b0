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

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>

#include <cmath>
#include <optional>
#include <vector>

namespace {

inline __mmask16 lanes(int64_t remaining) {
  if (remaining <= 0) return 0;
  return remaining >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << remaining) - 1);
}

// Adds bias [width] to every row of out [n, width] in place.
void add_bias(at::Tensor& out, const at::Tensor& bias) {
  const int64_t n = out.size(0), width = out.size(1);
  float* dst = out.data_ptr<float>();
  const float* b = bias.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < width; c += 16) {
      const __mmask16 m = lanes(width - c);
      float* at = dst + r * width + c;
      _mm512_mask_storeu_ps(at, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, at), _mm512_maskz_loadu_ps(m, b + c)));
    }
  }
}

// x [n, K] -> the concatenated outputs of `parts` [n, sum of out_features], biases added.
at::Tensor project(const at::Tensor& x, const std::vector<Projection>& parts) {
  if (parts.size() == 1 && parts[0].q.size(0) * 16 == parts[0].out_features) {  // 16 outputs per tile
    // One projection with no padding rows: its output is the result (copying it out, one value
    // at a time, had cost about 1.5 ms per pass per row verified on the default target).
    at::Tensor out = linear(x, parts[0].q, parts[0].scale, parts[0].min, parts[0].scale_step, parts[0].min_step,
                            parts[0].group, parts[0].bits);
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
    const at::Tensor y = linear(x, p.q, p.scale, p.min, p.scale_step, p.min_step, p.group, p.bits);
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
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 whole = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, whole);
  constexpr float c[] = {1.f, 0.693147180559945f, 0.240226506959101f, 0.0555041086648216f,
                         0.00961812910762848f, 0.00133335581464284f, 0.000154035303933816f,
                         1.52527338040598e-05f};
  __m512 p = _mm512_set1_ps(c[7]);
  for (int i = 6; i >= 0; --i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[i]));
  return _mm512_scalef_ps(p, whole);
}

// Zeroed accumulators for Blocks blocks of 16 lanes, and which lanes of each hold one of the
// `remaining` elements.
template <int64_t Blocks>
inline void start_blocks(__m512* acc, __mmask16* valid, int64_t remaining) {
  for (int64_t b = 0; b < Blocks; ++b) {
    acc[b] = _mm512_setzero_ps();
    valid[b] = lanes(remaining - 16 * b);
  }
}

// One query row of one head over `length` cached keys: out [head_dim] = softmax(q.K * scaling) V.
// keys_t: the keys transposed, [head_dim, key_stride] (row d holds component d of every key), so
// 16 keys' scores build up in one vector with no horizontal sums; values: [length, head_dim] rows;
// scores: scratch of at least `length`. Every score and output sums in one fixed order (over d,
// then over keys), whatever else is in the batch.
void attend(const float* query, const float* keys_t, int64_t key_stride, const float* values, int64_t length,
            int64_t head_dim, float scaling, float* scores, float* out) {
  constexpr int64_t kBlocks = 4;  // 64 keys at a time: four independent FMA chains
  __m512 best = _mm512_set1_ps(-INFINITY);
  for (int64_t j0 = 0; j0 < length; j0 += 16 * kBlocks) {
    __m512 dot[kBlocks];
    __mmask16 valid[kBlocks];
    start_blocks<kBlocks>(dot, valid, length - j0);
    for (int64_t d = 0; d < head_dim; ++d) {
      const __m512 q = _mm512_set1_ps(query[d]);
      const float* row = keys_t + d * key_stride + j0;
      for (int64_t b = 0; b < kBlocks; ++b) dot[b] = _mm512_fmadd_ps(q, _mm512_maskz_loadu_ps(valid[b], row + 16 * b), dot[b]);
    }
    for (int64_t b = 0; b < kBlocks; ++b) {
      const __m512 scaled = _mm512_mul_ps(dot[b], _mm512_set1_ps(scaling));
      _mm512_mask_storeu_ps(scores + j0 + 16 * b, valid[b], scaled);
      best = _mm512_mask_max_ps(best, valid[b], best, scaled);
    }
  }
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(best));
  __m512 total = _mm512_setzero_ps();
  for (int64_t j = 0; j < length; j += 16) {
    const __mmask16 m = lanes(length - j);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + j), top));
    _mm512_mask_storeu_ps(scores + j, m, e);
    total = _mm512_add_ps(total, _mm512_maskz_mov_ps(m, e));
  }
  const __m512 inverse = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(total));
  for (int64_t d0 = 0; d0 < head_dim; d0 += 16 * kBlocks) {  // 64 components at a time, in registers
    __m512 acc[kBlocks];
    __mmask16 valid[kBlocks];
    start_blocks<kBlocks>(acc, valid, head_dim - d0);
    for (int64_t j = 0; j < length; ++j) {
      const __m512 weight = _mm512_set1_ps(scores[j]);
      const float* row = values + j * head_dim + d0;
      for (int64_t b = 0; b < kBlocks; ++b) acc[b] = _mm512_fmadd_ps(weight, _mm512_maskz_loadu_ps(valid[b], row + 16 * b), acc[b]);
    }
    for (int64_t b = 0; b < kBlocks; ++b) _mm512_mask_storeu_ps(out + d0 + 16 * b, valid[b], _mm512_mul_ps(acc[b], inverse));
  }
}

// n query rows (row r at position start + r, its `heads` queries first in a row of `q_stride`
// floats) over the cache: out [n, heads * head_dim]. Keys transposed [kv_heads, head_dim,
// capacity], values [kv_heads, capacity, head_dim]; query head h reads kv head h / (heads / kv_heads).
// Each (row, head) is computed by one thread alone, in the same order whatever n is.
void causal_attention(const float* queries, int64_t q_stride, int64_t n, int64_t heads, int64_t kv_heads,
                      int64_t head_dim, const float* key_cache, const float* value_cache, int64_t capacity,
                      int64_t start, float scaling, float* out) {
  const int64_t group = heads / kv_heads;
  at::parallel_for(0, n * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(start + n);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / heads, head = task % heads, g = head / group;
      attend(queries + r * q_stride + head * head_dim, key_cache + g * head_dim * capacity, capacity,
             value_cache + g * capacity * head_dim, start + r + 1, head_dim, scaling, scores.data(),
             out + (r * heads + head) * head_dim);
    }
  });
}

// SwiGLU's product silu(gate) * up for one row of `inner` values, 16 at a time: done one
// std::exp at a time it cost about 1 ms per verified row on the default target (8 rows: a tenth
// of the pass). silu(x) = x * sigmoid(x), and sigmoid is 1 / (1 + e) for x >= 0 and e / (1 + e)
// below, with e = exp(-|x|) <= 1, so the exponential never overflows.
void swiglu(const float* gate, const float* up, int64_t inner, float* out) {
  const __m512 one = _mm512_set1_ps(1.f);
  for (int64_t i = 0; i < inner; i += 16) {
    const __mmask16 m = lanes(inner - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
    const __m512 inverse = _mm512_div_ps(one, _mm512_add_ps(one, e));
    const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 sigmoid = _mm512_mask_mul_ps(inverse, negative, e, inverse);
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_mul_ps(x, sigmoid), _mm512_maskz_loadu_ps(m, up + i)));
  }
}

void add_into(float* dst, const at::Tensor& y) {
  const float* src = y.data_ptr<float>();
  for (int64_t i = 0; i < y.numel(); ++i) dst[i] += src[i];
}

}  // namespace

// The same attention on tensors, for tests: queries [n, heads, head_dim], keys_t [kv_heads,
// head_dim, capacity], values [kv_heads, capacity, head_dim] holding start + n positions.
at::Tensor attention(at::Tensor queries, at::Tensor keys_t, at::Tensor values, int64_t start, double scaling) {
  queries = queries.contiguous();
  keys_t = keys_t.contiguous();
  values = values.contiguous();
  const int64_t n = queries.size(0), heads = queries.size(1), head_dim = queries.size(2);
  TORCH_CHECK(keys_t.size(1) == head_dim && start + n <= keys_t.size(2) && values.size(1) == keys_t.size(2),
              "cache shapes do not match");
  at::Tensor out = at::empty({n, heads, head_dim}, at::kFloat);
  causal_attention(queries.data_ptr<float>(), heads * head_dim, n, heads, keys_t.size(0), head_dim,
                   keys_t.data_ptr<float>(), values.data_ptr<float>(), keys_t.size(2), start,
                   static_cast<float>(scaling), out.data_ptr<float>());
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
  TORCH_CHECK(start + n <= keys[0].size(2) && keys[0].size(2) == values[0].size(1), "the KV cache is too small");
  float* h = hidden.data_ptr<float>();
  for (size_t index = 0; index < layers_.size(); ++index) {
    const Layer& layer = layers_[index];
    at::Tensor qkv = project(rms_norm(hidden, layer.input_norm, eps_), layer.qkv);  // [n, q+k+v]
    float* qkv_ptr = qkv.data_ptr<float>();
    const int64_t capacity = keys[index].size(2), qkv_width = qkv.size(1);
    float* key_cache = keys[index].data_ptr<float>();
    float* value_cache = values[index].data_ptr<float>();
    for (int64_t r = 0; r < n; ++r) {
      float* row = qkv_ptr + r * qkv_width;
      rotate(row, heads_, hd, cos.data_ptr<float>() + r * hd, sin.data_ptr<float>() + r * hd);
      rotate(row + q_width, kv_heads_, hd, cos.data_ptr<float>() + r * hd, sin.data_ptr<float>() + r * hd);
      for (int64_t g = 0; g < kv_heads_; ++g) {
        const float* key = row + q_width + g * hd;
        for (int64_t d = 0; d < hd; ++d) key_cache[(g * hd + d) * capacity + start + r] = key[d];
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
