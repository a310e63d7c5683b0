// The whole stack of Llama/Qwen2/Qwen3/Gemma 2/Gemma 3 decoder layers in one call: per layer
// RMSNorm, q/k/v projections (Qwen3, Gemma 3: each query and key head RMS-normalised), rotary
// embedding, the KV-cache write, causal attention (Gemma's local layers: over a sliding window;
// Gemma 2: soft-capped scores), the output projection, RMSNorm and the SwiGLU (Gemma: GeGLU) MLP,
// with the residual adds (Gemma: each of the two outputs RMS-normalised before its add). In Python the same layer is about 30 tensor
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
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <type_traits>
#include <vector>

namespace {

inline v16::Mask lanes(int64_t remaining) {
  if (remaining <= 0) return 0;
  return remaining >= 16 ? static_cast<v16::Mask>(0xFFFF) : static_cast<v16::Mask>((1u << remaining) - 1);
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

// RMSNorm in place of `heads` consecutive vectors of one row, each over its own head_dim values
// (Qwen3's q_norm and k_norm, before the rotary embedding): x [heads, head_dim], weight [head_dim].
void normalise_heads(float* x, int64_t heads, int64_t head_dim, const float* weight, double eps) {
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_dim;
    const float scale = rms_scale(v, head_dim, eps);
    for (int64_t i = 0; i < head_dim; ++i) v[i] = v[i] * scale * weight[i];
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

// sigmoid(z) is 1 / (1 + e) for z >= 0 and e / (1 + e) below, with e = exp(-|z|) <= 1, so the
// exponential never overflows.
inline v16::Vec sigmoid(v16::Vec z) {
  const v16::Vec one = v16::set1(1.f);
  const v16::Vec e = exp_nonpositive(v16::sub(v16::zero(), v16::abs(z)));
  const v16::Vec inverse = v16::div(one, v16::add(one, e));
  return v16::mask_mul(inverse, v16::less_than(z, v16::zero()), e, inverse);
}

// cap * tanh(x / cap): Gemma 2's soft cap on attention scores. tanh(|y|) = (1 - e) / (1 + e) with
// e = exp(-2 |y|) <= 1, its sign then restored.
inline v16::Vec soft_cap(v16::Vec x, float cap) {
  const v16::Vec y = v16::mul(x, v16::set1(1.f / cap)), one = v16::set1(1.f);
  const v16::Vec e = exp_nonpositive(v16::mul(v16::set1(-2.f), v16::abs(y)));
  const v16::Vec magnitude = v16::mul(v16::div(v16::sub(one, e), v16::add(one, e)), v16::set1(cap));
  return v16::mask_mul(magnitude, v16::less_than(y, v16::zero()), magnitude, v16::set1(-1.f));
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

// The KV cache's values as floats: float32 as stored, or float16 widened (the cache's default:
// half the memory and half the bytes attention reads per token, as llama.cpp's cache).
inline v16::Vec load_cached(v16::Mask m, const float* p) { return v16::load(m, p); }
inline v16::Vec load_cached(v16::Mask m, const at::Half* p) {
  return v16::load_half(m, reinterpret_cast<const uint16_t*>(p));
}

// Asks for count elements from p on into L1: the cache's next block while this one is worked on.
// Without it attention read a long cache at about 10 GB/s (its loops do little per line loaded,
// and the hardware's prefetching did not run far enough ahead): at 2,800 cached tokens the scores
// took half of a draft pass.
template <typename T>
inline void prefetch(const T* p, int64_t count) {
  const char* bytes = reinterpret_cast<const char*>(p);
  for (int64_t at = 0; at < count * static_cast<int64_t>(sizeof(T)); at += 64) _mm_prefetch(bytes + at, _MM_HINT_T0);
}

constexpr int kMaxHeads = 4;        // query heads at a time: 16 accumulators in registers
// The scores one pass of attend_kv_head holds at most (unless a single row needs more): a long
// prompt's rows go in passes whose scores stay in L2 between being written, exponentiated and
// weighed (all 256 rows of a prompt chunk at once would hold 17 MB per kv head at 2,800 tokens,
// read back from memory twice). Rows are computed alone either way, so the results are the same bits.
constexpr int64_t kScoreBytes = 512 * 1024;

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
// j0 + 63 from `lo` (a sliding window's first) and below `length`, into scores (H rows of
// `score_stride`), soft-capped where `cap` > 0 (Gemma 2), and each head's running 16-lane maximum
// `best` [H]. keys: a kv head's cache,
// blocks of kKeyBlock keys, each block transposed [head_dim, kKeyBlock] (row d holds component d
// of the block's keys): 16 keys' scores
// build up in one vector with no horizontal sums, and a block is one contiguous run of memory
// (transposing the whole cache instead had put each component of a block on its own page).
// Each key vector loaded feeds all H heads. Never inlined: each instantiation keeps its own
// register allocation (inlined, one spilled its accumulators on every key).
template <int H, typename T>
__attribute__((noinline)) void score_block(const float* queries, const T* keys, int64_t j0, int64_t lo,
                                           int64_t length, int64_t head_dim, float scaling, float cap, float* scores,
                                           int64_t score_stride, v16::Vec* best) {
  constexpr int64_t kBlocks = kKeyBlock / 16;  // four independent FMA chains per head
  v16::Vec dot[H][kBlocks];
  v16::Mask valid[kBlocks];
  for (int h = 0; h < H; ++h) start_blocks<kBlocks>(dot[h], valid, length - j0);
  const T* block = keys + j0 * head_dim;  // j0 is a multiple of kKeyBlock
  for (int64_t d = 0; d < head_dim; ++d) {
    const T* row = block + d * kKeyBlock;
    prefetch(row + head_dim * kKeyBlock, kKeyBlock);  // the same row of the next block
    v16::Vec key[kBlocks];
    for (int64_t b = 0; b < kBlocks; ++b) key[b] = load_cached(valid[b], row + 16 * b);
    for (int h = 0; h < H; ++h) {
      const v16::Vec q = v16::set1(queries[h * head_dim + d]);
      for (int64_t b = 0; b < kBlocks; ++b) dot[h][b] = v16::fmadd(q, key[b], dot[h][b]);
    }
  }
  for (int64_t b = 0; b < kBlocks; ++b) valid[b] &= static_cast<v16::Mask>(~lanes(lo - j0 - 16 * b));
  for (int h = 0; h < H; ++h) {
    for (int64_t b = 0; b < kBlocks; ++b) {
      v16::Vec scaled = v16::mul(dot[h][b], v16::set1(scaling));
      if (cap > 0) scaled = soft_cap(scaled, cap);
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
// values ([length, head_dim] rows); out starts at zero at the row's first block (`first`). Each
// value vector loaded feeds all H heads; every output sums over the keys in their order, block
// after block.
template <int H, typename T>
__attribute__((noinline)) void value_block(const float* weights, int64_t score_stride, const T* values, int64_t j0,
                                           int64_t end, bool first, int64_t head_dim, float* out) {
  constexpr int64_t kBlocks = 4;  // 64 components at a time, in registers
  for (int64_t d0 = 0; d0 < head_dim; d0 += 16 * kBlocks) {
    v16::Vec acc[H][kBlocks];
    v16::Mask valid[kBlocks];
    for (int h = 0; h < H; ++h) {
      start_blocks<kBlocks>(acc[h], valid, head_dim - d0);
      if (!first) {
        for (int64_t b = 0; b < kBlocks; ++b) acc[h][b] = v16::load(valid[b], out + h * head_dim + d0 + 16 * b);
      }
    }
    for (int64_t j = j0; j < end; ++j) {
      const T* row = values + j * head_dim + d0;
      prefetch(row + kKeyBlock * head_dim, std::min<int64_t>(16 * kBlocks, head_dim - d0));  // the next block's
      v16::Vec value[kBlocks];
      for (int64_t b = 0; b < kBlocks; ++b) value[b] = load_cached(valid[b], row + 16 * b);
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

// Rows first..last-1 of the query heads that read kv head g, over the cache (with a `window`,
// each row over its last `window` keys only): see AttentionTasks.
// Keys and values go block by block through every row's heads, so a verification reads the
// cache once rather than once per row (at 1,000 cached tokens re-reading it had made 4 rows' 
// attention cost 3.5 times one row's).
template <typename T>
void attend_kv_head(const float* queries, int64_t q_stride, int64_t first, int64_t last, int64_t heads,
                    int64_t group, int64_t g, int64_t head_dim, const T* keys, const T* values,
                    int64_t start, int64_t window, float scaling, float cap, float* out) {
  const int64_t rows = last - first, stride = start + last;
  // Row r's keys: from its window's first (0 without one) to its own position
  const auto length = [&](int64_t r) { return start + first + r + 1; };
  const auto lo = [&](int64_t r) { return window > 0 ? std::max<int64_t>(0, length(r) - window) : 0; };
  // Heads at a time: the group in near-even shares of at most kMaxHeads (6 as 3 + 3, not 4 + 2:
  // the loads of a share of 2 would feed only half as many products)
  const int64_t shares = (group + kMaxHeads - 1) / kMaxHeads, share = (group + shares - 1) / shares;
  std::vector<float> scores(rows * group * stride);
  std::vector<v16::Vec> best(rows * group, v16::set1(-INFINITY));
  // Query head h of row r (counted from `first`) within the group: its scores, its output
  const auto score_row = [&](int64_t r, int64_t h) { return scores.data() + (r * group + h) * stride; };
  const auto query = [&](int64_t r, int64_t h) { return queries + (first + r) * q_stride + (g * group + h) * head_dim; };
  const auto output = [&](int64_t r, int64_t h) { return out + ((first + r) * heads + g * group + h) * head_dim; };
  // The first block any row reads (a window's rows begin at or after it)
  const int64_t first_block = lo(0) / kKeyBlock * kKeyBlock;
  for (int64_t j0 = first_block; j0 < stride; j0 += kKeyBlock) {
    for (int64_t r = 0; r < rows; ++r) {
      if (j0 + kKeyBlock <= lo(r)) continue;
      for (int64_t h = 0; h < group && j0 < length(r); h += share) {
        with_heads(std::min(share, group - h), [&](auto n) {
          score_block<decltype(n)::value, T>(query(r, h), keys, j0, lo(r), length(r), head_dim, scaling, cap,
                                             score_row(r, h), stride, best.data() + r * group + h);
        });
      }
    }
  }
  std::vector<float> inverse(rows * group);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < group; ++h) {
      inverse[r * group + h] = exponentiate(score_row(r, h) + lo(r), length(r) - lo(r), best[r * group + h]);
    }
  }
  for (int64_t j0 = first_block; j0 < stride; j0 += kKeyBlock) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t begin = std::max(j0, lo(r)), end = std::min(j0 + kKeyBlock, length(r));
      for (int64_t h = 0; h < group && begin < end; h += share) {
        with_heads(std::min(share, group - h), [&](auto n) {
          value_block<decltype(n)::value, T>(score_row(r, h), stride, values, begin, end, j0 <= lo(r), head_dim,
                                             output(r, h));
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
struct AttentionTasks {
  const float* queries;
  int64_t q_stride, n, heads, kv_heads, head_dim;
  const void* key_cache;  // float32, or float16 when `half`
  const void* value_cache;
  bool half;
  int64_t capacity, start;
  int64_t window;  // 0: every key up to the row
  float scaling, cap;  // cap: the scores' soft cap (0: none)
  float* out;

  // A task is one kv head's queries over all rows, or over one row when there are fewer kv
  // heads than threads (so that every thread has work).
  int64_t row_tasks(int64_t threads) const { return kv_heads >= threads ? 1 : n; }

  void run(int64_t row_tasks, int64_t begin, int64_t end) const {
    if (half) return run_on<at::Half>(row_tasks, begin, end);
    run_on<float>(row_tasks, begin, end);
  }

  template <typename T>
  void run_on(int64_t row_tasks, int64_t begin, int64_t end) const {
    const T* keys = static_cast<const T*>(key_cache);
    const T* values = static_cast<const T*>(value_cache);
    const int64_t group = heads / kv_heads;
    // A task's rows go in passes of as many as keep their scores within kScoreBytes
    const int64_t pass_rows = std::max<int64_t>(1, kScoreBytes / (group * (start + n) * static_cast<int64_t>(sizeof(float))));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / row_tasks, first = row_tasks == 1 ? 0 : task % row_tasks;
      const int64_t last = row_tasks == 1 ? n : first + 1;
      for (int64_t f = first; f < last; f += pass_rows) {
        attend_kv_head(queries, q_stride, f, std::min(last, f + pass_rows), heads, group, g, head_dim,
                       keys + g * head_dim * capacity, values + g * capacity * head_dim, start, window, scaling, cap, out);
      }
    }
  }
};

// The gated product act(gate) * up for one row of `inner` values, 16 at a time: done one
// std::exp at a time it cost about 1 ms per verified row on the default target (8 rows: a tenth
// of the pass). SwiGLU: act(x) = silu(x) = x * sigmoid(x). GeGLU (gelu): tanh GELU,
// 0.5 x (1 + tanh(u)) with u = sqrt(2 / pi) (x + 0.044715 x^3), which is x * sigmoid(2u).
void gated(const float* gate, const float* up, int64_t inner, bool gelu, float* out) {
  for (int64_t i = 0; i < inner; i += 16) {
    const v16::Mask m = lanes(inner - i);
    const v16::Vec x = v16::load(m, gate + i);
    v16::Vec z = x;
    if (gelu) {
      const v16::Vec cube = v16::mul(v16::mul(x, x), x);
      z = v16::mul(v16::set1(2.f * 0.7978845608028654f), v16::fmadd(v16::set1(0.044715f), cube, x));
    }
    v16::store(out + i, m, v16::mul(v16::mul(x, sigmoid(z)), v16::load(m, up + i)));
  }
}

// Whether a cache's keys and values are float16 (else float32; nothing else is accepted).
bool cache_is_half(const at::Tensor& keys, const at::Tensor& values) {
  const bool half = keys.scalar_type() == at::kHalf;
  TORCH_CHECK((half || keys.scalar_type() == at::kFloat) && values.scalar_type() == keys.scalar_type(),
              "the KV cache must be float32 or float16, keys and values alike");
  return half;
}

// A layer step of the projections of one input (checked here, once, not on every pass).
Step make_step(const std::vector<Projection>& projections) {
  Step step;
  for (const Projection& p : projections) {
    Part part{PreparedWeight(p), p.bias ? p.bias->data_ptr<float>() : nullptr, p.out_features, step.width,
              step.padded_width};
    const int64_t input = part.weight.params.groups * p.group;
    TORCH_CHECK(p.out_features <= 2 * kTile * part.weight.pairs, "more outputs than the packed weight holds");
    TORCH_CHECK(step.parts.empty() || input == step.input, "the projections of one step must share their input");
    TORCH_CHECK(!p.bias || (p.bias->scalar_type() == at::kFloat && p.bias->is_contiguous() &&
                            p.bias->numel() == p.out_features),
                "a bias must be float32 [out_features]");
    step.input = input;
    step.groups[p.group == 32] = true;
    step.width += p.out_features;
    step.padded_width += 2 * kTile * part.weight.pairs;
    step.parts.push_back(part);
  }
  return step;
}

// The buffers of one call of the stack for n rows, allocated once per call rather than per
// layer and operation.
struct Workspace {
  std::vector<float> normed, qkv, attended, gate_up, inner, padded;  // the steps' inputs and outputs
  std::vector<float> projected;  // an output or down projection's result before its norm (Gemma 3)
  std::vector<int8_t> values[2];  // int8 activations in groups of 16 and of 32: [n, widest input]
  std::vector<float> steps[2], scaled_sums[2];
  std::vector<int32_t> sums[2];

  // The int8 activations of a step's input in groups of `group`.
  QuantizedView quantized(const Step& step, int64_t group) {
    const int g = group == 32;
    return {values[g].data(), steps[g].data(), scaled_sums[g].data(), sums[g].data(), step.input};
  }
};

// This thread's share of making a step's input int8: units of 16 or 32 inputs (the step's largest
// group) of x [n, step.input], each first written by make(row, column, count), then quantized in
// every group size the step's parts take.
template <typename Make>
void quantize_share(const Step& step, int64_t n, const float* x, Workspace& ws, int thread, int threads,
                    Make&& make) {
  const int64_t k = step.input, unit = step.groups[1] ? 32 : 16, per_row = k / unit;
  const auto [begin, end] = share(n * per_row, thread, threads);
  // The share's units row by row: one call each for its part of a row (a call per unit would
  // cost more than the work of a unit)
  for (int64_t u = begin; u < end;) {
    const int64_t row = u / per_row, last = std::min(end, (row + 1) * per_row);
    const int64_t column = (u % per_row) * unit, count = (last - u) * unit;
    make(row, column, count);
    for (const int64_t group : {16, 32}) {
      if (!step.groups[group == 32]) continue;
      const int64_t first = (row * k + column) / group;
      quantize_groups(x, group, first, first + count / group, ws.quantized(step, group));
    }
    u = last;
  }
}

// Tile pairs begin .. end - 1 of a step's products (its parts' pairs in order). Each pair's real
// outputs go to out [n, out_stride] at its part's column, plus the bias; with `add`, onto what out
// holds (the residual stream). Weights without padding, bias or add are written there directly;
// the others go through the padded buffer.
void step_products(const Step& step, int64_t n, Workspace& ws, float* out, int64_t out_stride, bool add, int64_t begin,
                   int64_t end) {
  int64_t first_pair = 0;  // of the part, among the step's
  for (const Part& part : step.parts) {
    const int64_t lo = std::max(begin - first_pair, int64_t{0});
    const int64_t hi = std::min(end - first_pair, part.weight.pairs);
    first_pair += part.weight.pairs;
    if (lo >= hi) continue;
    const Activations act = ws.quantized(step, part.weight.group).activations();
    if (!add && !part.bias && part.out_features == 2 * kTile * part.weight.pairs) {
      pair_range(part.weight, act, n, lo, hi, out + part.column, out_stride);
      continue;
    }
    float* padded = ws.padded.data() + part.padded_column;
    pair_range(part.weight, act, n, lo, hi, padded, step.padded_width);
    const int64_t c0 = 2 * kTile * lo, c1 = std::min(2 * kTile * hi, part.out_features);
    for (int64_t r = 0; r < n; ++r) {
      const float* src = padded + r * step.padded_width;
      float* dst = out + r * out_stride + part.column;
      for (int64_t c = c0; c < c1; ++c) {
        const float value = part.bias ? src[c] + part.bias[c] : src[c];
        dst[c] = add ? dst[c] + value : value;
      }
    }
  }
}

// A step's products shared between the team (see take_pairs).
void products_shared(const Step& step, int64_t n, Workspace& ws, float* out, int64_t out_stride, bool add,
                     PairRange* ranges, int thread, int threads) {
  take_pairs(ranges, thread, threads, step.padded_width / (2 * kTile), [&](int64_t first, int64_t end) {
    step_products(step, n, ws, out, out_stride, add, first, end);
  });
}

}  // namespace

// The same attention on tensors, for tests: queries [n, heads, head_dim], keys and values
// [kv_heads, capacity, head_dim] holding start + n positions (the keys are laid out in blocks here).
at::Tensor attention(at::Tensor queries, at::Tensor keys, at::Tensor values, int64_t start, double scaling,
                     int64_t window, double cap) {
  TORCH_CHECK(queries.dim() == 3 && queries.scalar_type() == at::kFloat && keys.dim() == 3 && start >= 0,
              "queries [n, heads, head_dim] float32, keys and values [kv_heads, capacity, head_dim]");
  queries = queries.contiguous();
  keys = keys.contiguous();
  values = values.contiguous();
  const int64_t n = queries.size(0), heads = queries.size(1), head_dim = queries.size(2);
  const int64_t kv_heads = keys.size(0), capacity = keys.size(1);
  TORCH_CHECK(keys.size(2) == head_dim && start + n <= capacity && values.sizes() == keys.sizes() &&
                  capacity % kKeyBlock == 0 && kv_heads > 0 && heads % kv_heads == 0,
              "cache shapes do not match");
  const bool half = cache_is_half(keys, values);
  const at::Tensor blocked = keys.view({kv_heads, capacity / kKeyBlock, kKeyBlock, head_dim}).transpose(2, 3).contiguous();
  at::Tensor out = at::empty({n, heads, head_dim}, at::kFloat);
  const AttentionTasks tasks{queries.data_ptr<float>(), heads * head_dim, n, heads, kv_heads, head_dim,
                             blocked.data_ptr(), values.data_ptr(), half, capacity, start, window,
                             static_cast<float>(scaling), static_cast<float>(cap), out.data_ptr<float>()};
  const int64_t row_tasks = tasks.row_tasks(at::get_num_threads());
  at::parallel_for(0, kv_heads * row_tasks, 1, [&](int64_t begin, int64_t end) { tasks.run(row_tasks, begin, end); });
  return out;
}

// gate_up [n, 2 * inner] (gate, then up) -> silu(gate) * up [n, inner] (gelu: tanh GELU), rows
// shared between threads.
at::Tensor swiglu_rows(at::Tensor gate_up, bool gelu) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.scalar_type() == at::kFloat && gate_up.size(1) % 2 == 0,
              "gate_up must be [n, 2 * inner] float32");
  gate_up = gate_up.contiguous();
  const int64_t n = gate_up.size(0), inner = gate_up.size(1) / 2;
  at::Tensor out = at::empty({n, inner}, at::kFloat);
  const float* gu = gate_up.data_ptr<float>();
  float* product = out.data_ptr<float>();
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) gated(gu + r * 2 * inner, gu + r * 2 * inner + inner, inner, gelu, product + r * inner);
  });
  return out;
}

LayerStack::LayerStack(std::vector<Layer> layers, int64_t heads, int64_t kv_heads, int64_t head_dim,
                       double scaling, double eps, bool gelu, double cap)
    : layers_(std::move(layers)), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim),
      scaling_(static_cast<float>(scaling)), cap_(static_cast<float>(cap)), eps_(eps), gelu_(gelu) {
  TORCH_CHECK(!layers_.empty() && heads % kv_heads == 0 && head_dim % 2 == 0,
              "layers, heads a multiple of kv_heads and an even head_dim");
  for (const Layer& layer : layers_) {
    Steps steps{make_step(layer.qkv), make_step({layer.output}), make_step(layer.gate_up), make_step({layer.down})};
    const int64_t d = layer.input_norm.numel();
    TORCH_CHECK(d > 0 && d == layers_[0].input_norm.numel(), "every layer of one width");
    for (const at::Tensor& norm : {layer.input_norm, layer.post_norm}) {
      TORCH_CHECK(norm.scalar_type() == at::kFloat && norm.is_contiguous(), "a layer norm must be float32, contiguous");
    }
    TORCH_CHECK(layer.q_norm.defined() == layer.k_norm.defined(), "query and key head norms come together");
    TORCH_CHECK(layer.attention_out_norm.defined() == layer.feed_forward_out_norm.defined(),
                "the attention's and the feed-forward layer's output norms come together");
    for (const at::Tensor& norm : {layer.attention_out_norm, layer.feed_forward_out_norm}) {
      TORCH_CHECK(!norm.defined() || (norm.scalar_type() == at::kFloat && norm.is_contiguous() && norm.numel() == d),
                  "an output norm must be float32 [D]");
    }
    TORCH_CHECK(layer.window >= 0, "a sliding window of at least one key, or 0 for none");
    for (const at::Tensor& norm : {layer.q_norm, layer.k_norm}) {
      TORCH_CHECK(!norm.defined() || (norm.scalar_type() == at::kFloat && norm.is_contiguous() && norm.numel() == head_dim),
                  "a head norm must be float32 [head_dim]");
    }
    TORCH_CHECK(steps.qkv.input == d && steps.qkv.width == (heads + 2 * kv_heads) * head_dim &&
                    steps.output.input == heads * head_dim && steps.output.width == d && steps.gate_up.input == d &&
                    steps.gate_up.width == 2 * steps.down.input && steps.down.width == d &&
                    layer.post_norm.numel() == d,
                "the layer's projections do not fit together");
    for (const Step* step : {&steps.qkv, &steps.output, &steps.gate_up, &steps.down}) {
      widest_input_ = std::max(widest_input_, step->input);
      widest_padded_ = std::max(widest_padded_, step->padded_width);
    }
    widest_inner_ = std::max(widest_inner_, steps.down.input);
    steps_.push_back(std::move(steps));
  }
}

at::Tensor LayerStack::forward(at::Tensor hidden, const std::vector<at::Tensor>& keys,
                               const std::vector<at::Tensor>& values, at::Tensor cos, at::Tensor sin, int64_t start,
                               std::optional<at::Tensor> local_cos, std::optional<at::Tensor> local_sin) {
  TORCH_CHECK(keys.size() == layers_.size() && values.size() == layers_.size(), "one cache per layer");
  hidden = hidden.contiguous().clone();
  cos = cos.contiguous();
  sin = sin.contiguous();
  TORCH_CHECK(local_cos.has_value() == local_sin.has_value() &&
                  (!local_cos || (local_cos->sizes() == cos.sizes() && local_sin->sizes() == sin.sizes())),
              "the local layers' rotary embedding comes as cos and sin, shaped as the global one");
  const at::Tensor local_cos_rows = local_cos ? local_cos->contiguous() : cos;
  const at::Tensor local_sin_rows = local_sin ? local_sin->contiguous() : sin;
  const int64_t n = hidden.size(0), hd = head_dim_, d = hidden.size(1);
  const int64_t q_width = heads_ * hd, kv_width = kv_heads_ * hd, group = heads_ / kv_heads_;
  TORCH_CHECK(hidden.dim() == 2 && hidden.scalar_type() == at::kFloat && start >= 0, "hidden must be [n, D] float32");
  TORCH_CHECK(values[0].dim() == 3 && values[0].size(0) == kv_heads_ && values[0].size(2) == hd,
              "values must be [kv_heads, capacity, head_dim]");
  TORCH_CHECK(keys[0].dim() == 4 && keys[0].size(0) == kv_heads_ && keys[0].size(2) == hd &&
                  keys[0].size(3) == kKeyBlock && keys[0].size(1) * kKeyBlock == values[0].size(1),
              "keys must be [kv_heads, capacity / kKeyBlock, head_dim, kKeyBlock], as many as the values hold");
  TORCH_CHECK(start + n <= values[0].size(1), "the KV cache is too small");
  const bool half = cache_is_half(keys[0], values[0]);
  for (size_t index = 0; index < layers_.size(); ++index) {
    TORCH_CHECK(cache_is_half(keys[index], values[index]) == half, "every layer's cache of one type");
    TORCH_CHECK(keys[index].sizes() == keys[0].sizes() && values[index].sizes() == values[0].sizes() &&
                    keys[index].is_contiguous() && values[index].is_contiguous(),
                "every layer's cache of one shape, contiguous");
  }
  // one rotary row per new position: a table shorter than the rows would be read past its end
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.dim() == 2 && cos.size(0) == n && cos.size(1) == hd &&
                  sin.sizes() == cos.sizes() && sin.scalar_type() == at::kFloat &&
                  local_cos_rows.scalar_type() == at::kFloat && local_sin_rows.scalar_type() == at::kFloat,
              "cos and sin must be float32 [n, head_dim]");
  TORCH_CHECK(d == layers_[0].input_norm.numel(), "hidden states of the wrong width");
  const int64_t qkv_width = q_width + 2 * kv_width;
  Workspace ws;
  ws.normed.resize(n * d);
  ws.qkv.resize(n * qkv_width);
  ws.attended.resize(n * q_width);
  ws.gate_up.resize(n * 2 * widest_inner_);
  ws.inner.resize(n * widest_inner_);
  ws.padded.resize(n * widest_padded_);
  ws.projected.resize(layers_[0].attention_out_norm.defined() ? n * d : 0);
  for (int g = 0; g < 2; ++g) {
    ws.values[g].resize(n * widest_input_);
    ws.steps[g].resize(n * widest_input_ / 16);
    ws.scaled_sums[g].resize(n * widest_input_ / 16);
    ws.sums[g].resize(n * widest_input_ / 16);
  }
  std::vector<PairRange> ranges;  // set by the team's first thread
  float* h = hidden.data_ptr<float>();
  const float* global_cos = cos.data_ptr<float>();
  const float* global_sin = sin.data_ptr<float>();
  // One team of threads for the whole stack, meeting at a barrier after each step: forking and
  // joining for each operation had left one core idle while the other ran the small serial parts
  // (norms, quantization, rotary embedding, SwiGLU, allocations).
#pragma omp parallel num_threads(at::get_num_threads())
  {
    const int thread = omp_get_thread_num(), threads = omp_get_num_threads();
    // The tile pairs left per step of every layer, per thread.
#pragma omp single
    {
      ranges = std::vector<PairRange>(4 * layers_.size() * threads);
      for (size_t index = 0; index < layers_.size(); ++index) {
        const Steps& s = steps_[index];
        PairRange* at = ranges.data() + 4 * index * threads;
        for (const Step* step : {&s.qkv, &s.output, &s.gate_up, &s.down}) {
          share_pairs(step->padded_width / (2 * kTile), at, threads);
          at += threads;
        }
      }
    }
    for (size_t index = 0; index < layers_.size(); ++index) {
      PairRange* layer_ranges = ranges.data() + 4 * index * threads;
      const Layer& layer = layers_[index];
      const Steps& steps = steps_[index];
      const int64_t capacity = values[index].size(1), inner = steps.down.input;
      void* key_cache = keys[index].data_ptr();
      void* value_cache = values[index].data_ptr();
      const float* cos_rows = layer.window > 0 ? local_cos_rows.data_ptr<float>() : global_cos;
      const float* sin_rows = layer.window > 0 ? local_sin_rows.data_ptr<float>() : global_sin;
      // A step's products added to the residual stream h, or (Gemma 3: an output norm) first
      // RMS-normalised, rows shared between the team (a row's norm needs the whole row: a barrier)
      const auto add_to_residual = [&](const Step& step, PairRange* step_ranges, const at::Tensor& out_norm) {
        if (!out_norm.defined()) return products_shared(step, n, ws, h, d, true, step_ranges, thread, threads);
        products_shared(step, n, ws, ws.projected.data(), d, false, step_ranges, thread, threads);
#pragma omp barrier
        const float* w = out_norm.data_ptr<float>();
        const auto [begin, end] = share(n, thread, threads);
        for (int64_t row = begin; row < end; ++row) {
          const float* x = ws.projected.data() + row * d;
          const float row_scale = rms_scale(x, d, eps_);
          for (int64_t i = 0; i < d; ++i) h[row * d + i] += x[i] * row_scale * w[i];
        }
      };
      // RMSNorm of h's rows into `normed`, a thread's part of a row at a time (each thread works
      // out the row's scale itself: quantize_share calls it once per row it has a part of)
      const auto normalise = [&](const at::Tensor& weight) {
        return [&, w = weight.data_ptr<float>()](int64_t row, int64_t column, int64_t count) {
          const float row_scale = rms_scale(h + row * d, d, eps_);
          for (int64_t i = column; i < column + count; ++i) ws.normed[row * d + i] = h[row * d + i] * row_scale * w[i];
        };
      };
      quantize_share(steps.qkv, n, ws.normed.data(), ws, thread, threads, normalise(layer.input_norm));
#pragma omp barrier
      products_shared(steps.qkv, n, ws, ws.qkv.data(), qkv_width, false, layer_ranges, thread, threads);
#pragma omp barrier
      {  // the heads' norms (Qwen3), rotary embedding and the cache write, per row and kv head
        const auto [begin, end] = share(n * kv_heads_, thread, threads);
        for (int64_t task = begin; task < end; ++task) {
          const int64_t r = task / kv_heads_, g = task % kv_heads_, position = start + r;
          float* row = ws.qkv.data() + r * qkv_width;
          float* key = row + q_width + g * hd;
          if (layer.q_norm.defined()) {
            normalise_heads(row + g * group * hd, group, hd, layer.q_norm.data_ptr<float>(), eps_);
            normalise_heads(key, 1, hd, layer.k_norm.data_ptr<float>(), eps_);
          }
          rotate(row + g * group * hd, group, hd, cos_rows + r * hd, sin_rows + r * hd);
          rotate(key, 1, hd, cos_rows + r * hd, sin_rows + r * hd);
          const auto write = [&](auto* key_cache, auto* value_cache) {  // float16: rounded to nearest
            auto* block = key_cache + g * capacity * hd + (position / kKeyBlock) * hd * kKeyBlock;
            for (int64_t i = 0; i < hd; ++i) block[i * kKeyBlock + position % kKeyBlock] = key[i];
            std::copy_n(row + q_width + kv_width + g * hd, hd, value_cache + (g * capacity + position) * hd);
          };
          if (half) {
            write(static_cast<at::Half*>(key_cache), static_cast<at::Half*>(value_cache));
          } else {
            write(static_cast<float*>(key_cache), static_cast<float*>(value_cache));
          }
        }
      }
#pragma omp barrier
      {
        const AttentionTasks tasks{ws.qkv.data(), qkv_width, n, heads_, kv_heads_, hd, key_cache, value_cache, half,
                                   capacity, start, layer.window, scaling_, cap_, ws.attended.data()};
        const int64_t row_tasks = tasks.row_tasks(threads);
        const auto [begin, end] = share(kv_heads_ * row_tasks, thread, threads);
        tasks.run(row_tasks, begin, end);
      }
#pragma omp barrier
      quantize_share(steps.output, n, ws.attended.data(), ws, thread, threads, [](int64_t, int64_t, int64_t) {});
#pragma omp barrier
      add_to_residual(steps.output, layer_ranges + 1 * threads, layer.attention_out_norm);
#pragma omp barrier
      quantize_share(steps.gate_up, n, ws.normed.data(), ws, thread, threads, normalise(layer.post_norm));
#pragma omp barrier
      products_shared(steps.gate_up, n, ws, ws.gate_up.data(), 2 * inner, false, layer_ranges + 2 * threads, thread, threads);
#pragma omp barrier
      quantize_share(steps.down, n, ws.inner.data(), ws, thread, threads, [&](int64_t row, int64_t column, int64_t count) {
        const float* gate = ws.gate_up.data() + row * 2 * inner + column;
        gated(gate, gate + inner, count, gelu_, ws.inner.data() + row * inner + column);
      });
#pragma omp barrier
      add_to_residual(steps.down, layer_ranges + 3 * threads, layer.feed_forward_out_norm);
#pragma omp barrier
    }
  }
  return hidden;
}
