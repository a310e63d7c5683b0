// Low-bit linear layers for the CPU: 4- or 8-bit unsigned weights with a scale and a min per
// group of G inputs (w = scale * q - min), times activations quantized to int8 per row and per
// group. Integer dot products (AVX-512 VNNI) do the work; every output element is computed by
// the same sequence of operations whatever the number of rows, so a token verified inside a
// batch gets exactly the logits it would get alone (batch invariance).
//
// Layout (see lowbit/packing.py, which also holds the pure-torch reference):
//   q      uint8  [N/16, K/G, C', 16, 4]  C = G/4 chunks of 4 inputs; 8-bit: C' = C, one byte per
//                                          weight; 4-bit: C' = C/2, chunk 2p in the low nibble and
//                                          chunk 2p+1 in the high nibble.
//   scale  fp16   [N/16, K/G, 16]
//   min    fp16   [N/16, K/G, 16]
// A 32-bit lane of a 64-byte vector holds 4 consecutive inputs of one output, so one VNNI
// instruction advances 16 outputs by 4 inputs against 4 broadcast activation bytes.
#include "kernel.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>

namespace {

constexpr int64_t kTile = 16;
constexpr int64_t kAhead = 4;  // groups to prefetch ahead
constexpr int kMaxRows = 4;  // rows per register block (x 2 tiles x 2 accumulators)

struct QuantizedRows {
  torch::Tensor q;           // int8 [M, K]
  torch::Tensor scale;       // float [M, K/G]: int8 step of each group
  torch::Tensor scaled_sum;  // float [M, K/G]: scale * (sum of the group's int8 values)
};

// Symmetric int8 per row and group; the same arithmetic as packing.quantize_activations.
QuantizedRows quantize_rows(const torch::Tensor& x, int64_t group) {
  const int64_t rows = x.size(0), k = x.size(1), groups = k / group;
  QuantizedRows out{torch::empty({rows, k}, torch::kInt8), torch::empty({rows, groups}, torch::kFloat),
                    torch::empty({rows, groups}, torch::kFloat)};
  const float* src = x.data_ptr<float>();
  int8_t* q = out.q.data_ptr<int8_t>();
  float* scale = out.scale.data_ptr<float>();
  float* scaled_sum = out.scaled_sum.data_ptr<float>();
  for (int64_t i = 0; i < rows * groups; ++i) {
    const float* v = src + i * group;
    float amax = 0.f;
    for (int64_t j = 0; j < group; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float step = amax / 127.f;
    const float inverse = amax > 0.f ? 127.f / amax : 0.f;
    int32_t sum = 0;
    for (int64_t j = 0; j < group; ++j) {
      const int32_t value = static_cast<int32_t>(std::nearbyint(v[j] * inverse));
      q[i * group + j] = static_cast<int8_t>(value);
      sum += value;
    }
    scale[i] = step;
    scaled_sum[i] = step * static_cast<float>(sum);
  }
  return out;
}

inline __m512i broadcast4(const int8_t* p) {
  int32_t word;
  std::memcpy(&word, p, 4);
  return _mm512_set1_epi32(word);
}

// Two 16-output tiles against `Rows` activation rows, over all K: each broadcast activation word
// feeds both tiles, which halves the broadcasts (the limit of this loop on AVX-512 machines).
// The arithmetic of each output is the same whatever Rows is: batch invariance.
template <int Rows, int Chunks, bool FourBit>
void tile_pair_kernel(const uint8_t* q, int64_t tile_bytes, const at::Half* scale, const at::Half* min,
                      int64_t groups, const int8_t* act, const float* act_scale, const float* act_sum, int64_t k,
                      float* out, int64_t out_stride) {
  constexpr int kPacked = FourBit ? Chunks / 2 : Chunks;
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  const uint8_t* q1 = q + tile_bytes;
  const int64_t scale_stride = groups * kTile;  // between the two tiles' scales
  __m512 acc0[Rows], acc1[Rows];
  for (int r = 0; r < Rows; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    // Prefetch a few groups ahead on all six streams (two tiles x weights, scales, mins): the
    // hardware prefetcher alone leaves DRAM bandwidth unused at one or two rows. Past the last
    // group the addresses run into the next tile pair, which comes next; prefetches never fault.
    {
      for (int line = 0; line < kPacked; ++line) {
        _mm_prefetch(reinterpret_cast<const char*>(q + ((g + kAhead) * kPacked + line) * 64), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(q1 + ((g + kAhead) * kPacked + line) * 64), _MM_HINT_T0);
      }
      if ((g & 1) == 0) {
        const int64_t at = (g + kAhead) * kTile;
        _mm_prefetch(reinterpret_cast<const char*>(scale + at), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(min + at), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(scale + scale_stride + at), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(min + scale_stride + at), _MM_HINT_T0);
      }
    }
    __m512i dot0[Rows], dot1[Rows];
    for (int r = 0; r < Rows; ++r) dot0[r] = dot1[r] = _mm512_setzero_si512();
    const int8_t* a = act + g * Chunks * 4;
    for (int p = 0; p < kPacked; ++p) {
      const __m512i v0 = _mm512_loadu_si512(q + (g * kPacked + p) * 64);
      const __m512i v1 = _mm512_loadu_si512(q1 + (g * kPacked + p) * 64);
      for (int half = 0; half < (FourBit ? 2 : 1); ++half) {
        __m512i w0 = v0, w1 = v1;
        if constexpr (FourBit) {
          w0 = _mm512_and_si512(half ? _mm512_srli_epi16(v0, 4) : v0, low_nibbles);
          w1 = _mm512_and_si512(half ? _mm512_srli_epi16(v1, 4) : v1, low_nibbles);
        }
        const int chunk = FourBit ? 2 * p + half : p;
        for (int r = 0; r < Rows; ++r) {
          const __m512i word = broadcast4(a + r * k + 4 * chunk);
          dot0[r] = _mm512_dpbusd_epi32(dot0[r], w0, word);
          dot1[r] = _mm512_dpbusd_epi32(dot1[r], w1, word);
        }
      }
    }
    const at::Half* s0 = scale + g * kTile;
    const at::Half* m0 = min + g * kTile;
    const __m512 w_scale0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s0)));
    const __m512 w_min0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(m0)));
    const __m512 w_scale1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s0 + scale_stride)));
    const __m512 w_min1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(m0 + scale_stride)));
    for (int r = 0; r < Rows; ++r) {
      const int64_t at = r * groups + g;
      const __m512 a_step = _mm512_set1_ps(act_scale[at]);
      const __m512 a_sum = _mm512_set1_ps(act_sum[at]);
      acc0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot0[r]), _mm512_mul_ps(w_scale0, a_step), acc0[r]);
      acc0[r] = _mm512_fnmadd_ps(w_min0, a_sum, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot1[r]), _mm512_mul_ps(w_scale1, a_step), acc1[r]);
      acc1[r] = _mm512_fnmadd_ps(w_min1, a_sum, acc1[r]);
    }
  }
  for (int r = 0; r < Rows; ++r) {
    _mm512_storeu_ps(out + r * out_stride, acc0[r]);
    _mm512_storeu_ps(out + r * out_stride + kTile, acc1[r]);
  }
}

template <int Chunks, bool FourBit>
void rows_kernel(int rows, const uint8_t* q, int64_t tile_bytes, const at::Half* scale, const at::Half* min,
                 int64_t groups, const int8_t* act, const float* act_scale, const float* act_sum, int64_t k,
                 float* out, int64_t out_stride) {
#define SPECCHAT_ROWS(R)                                                                                   \
  case R:                                                                                                  \
    return tile_pair_kernel<R, Chunks, FourBit>(q, tile_bytes, scale, min, groups, act, act_scale, act_sum, \
                                                k, out, out_stride);
  switch (rows) { SPECCHAT_ROWS(1) SPECCHAT_ROWS(2) SPECCHAT_ROWS(3) SPECCHAT_ROWS(4) }
#undef SPECCHAT_ROWS
}

}  // namespace

// x [M, K] float32 -> [M, N] float32
torch::Tensor linear(torch::Tensor x, torch::Tensor q, torch::Tensor scale, torch::Tensor min, int64_t group,
                     int64_t bits) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat, "x must be [M, K] float32");
  TORCH_CHECK(group == 16 || group == 32, "group must be 16 or 32");
  TORCH_CHECK(bits == 4 || bits == 8, "bits must be 4 or 8");
  x = x.contiguous();
  const int64_t rows = x.size(0), k = x.size(1), tiles = scale.size(0), groups = k / group;
  TORCH_CHECK(k % group == 0 && scale.size(1) == groups, "K does not match the packed weight");
  const QuantizedRows act = quantize_rows(x, group);
  torch::Tensor out = torch::empty({rows, tiles * kTile}, torch::kFloat);
  const int64_t tile_bytes = q.numel() / tiles;
  const uint8_t* q_ptr = q.data_ptr<uint8_t>();
  const at::Half* scale_ptr = scale.data_ptr<at::Half>();
  const at::Half* min_ptr = min.data_ptr<at::Half>();
  const int8_t* a = act.q.data_ptr<int8_t>();
  const float* a_scale = act.scale.data_ptr<float>();
  const float* a_sum = act.scaled_sum.data_ptr<float>();
  float* out_ptr = out.data_ptr<float>();
  const int64_t n = tiles * kTile;
  TORCH_CHECK(tiles % 2 == 0, "the kernel works on pairs of 16-output tiles (N % 32 == 0)");
  at::parallel_for(0, tiles / 2, 1, [&](int64_t begin, int64_t end) {
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t t = 2 * pair;
      for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
        const int block = static_cast<int>(std::min<int64_t>(kMaxRows, rows - r0));
        const uint8_t* tq = q_ptr + t * tile_bytes;
        const at::Half* ts = scale_ptr + t * groups * kTile;
        const at::Half* tm = min_ptr + t * groups * kTile;
        const int8_t* ta = a + r0 * k;
        const float* tas = a_scale + r0 * groups;
        const float* tsum = a_sum + r0 * groups;
        float* to = out_ptr + r0 * n + t * kTile;
        if (bits == 4 && group == 32) rows_kernel<8, true>(block, tq, tile_bytes, ts, tm, groups, ta, tas, tsum, k, to, n);
        else if (bits == 4) rows_kernel<4, true>(block, tq, tile_bytes, ts, tm, groups, ta, tas, tsum, k, to, n);
        else if (group == 32) rows_kernel<8, false>(block, tq, tile_bytes, ts, tm, groups, ta, tas, tsum, k, to, n);
        else rows_kernel<4, false>(block, tq, tile_bytes, ts, tm, groups, ta, tas, tsum, k, to, n);
      }
    }
  });
  return out;
}

// The float rows of the weight for the given output indices (embedding lookup): [len(ids), K].
torch::Tensor rows(torch::Tensor ids, torch::Tensor q, torch::Tensor scale, torch::Tensor min, int64_t group,
                   int64_t bits) {
  const int64_t tiles = scale.size(0), groups = scale.size(1), k = groups * group, chunks = group / 4;
  const int64_t tile_bytes = q.numel() / tiles;
  ids = ids.contiguous().to(torch::kLong);
  torch::Tensor out = torch::empty({ids.numel(), k}, torch::kFloat);
  const int64_t* id = ids.data_ptr<int64_t>();
  const uint8_t* q_ptr = q.data_ptr<uint8_t>();
  const at::Half* scale_ptr = scale.data_ptr<at::Half>();
  const at::Half* min_ptr = min.data_ptr<at::Half>();
  float* out_ptr = out.data_ptr<float>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t tile = id[i] / kTile, lane = id[i] % kTile;
    TORCH_CHECK(id[i] >= 0 && tile < tiles, "token id out of range");
    for (int64_t g = 0; g < groups; ++g) {
      const float s = static_cast<float>(scale_ptr[(tile * groups + g) * kTile + lane]);
      const float m = static_cast<float>(min_ptr[(tile * groups + g) * kTile + lane]);
      for (int64_t c = 0; c < chunks; ++c) {
        for (int64_t b = 0; b < 4; ++b) {
          uint8_t value;
          if (bits == 4) {
            const uint8_t byte = q_ptr[tile * tile_bytes + ((g * chunks / 2 + c / 2) * kTile + lane) * 4 + b];
            value = (c % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
          } else {
            value = q_ptr[tile * tile_bytes + ((g * chunks + c) * kTile + lane) * 4 + b];
          }
          out_ptr[i * k + g * group + c * 4 + b] = s * static_cast<float>(value) - m;
        }
      }
    }
  }
  return out;
}

// RMSNorm of each row: x [M, D] float32 -> x / sqrt(mean(x^2) + eps) * weight. One pass per row
// instead of six tensor ops (their dispatch costs more than the arithmetic at decoding sizes).
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  x = x.contiguous();
  const int64_t d = x.size(-1), rows = x.numel() / d;
  torch::Tensor out = torch::empty_like(x);
  const float* src = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (int64_t i = 0; i < d; ++i) sum += static_cast<double>(src[r * d + i]) * src[r * d + i];
    const float scale = static_cast<float>(1.0 / std::sqrt(sum / d + eps));
    for (int64_t i = 0; i < d; ++i) dst[r * d + i] = src[r * d + i] * scale * w[i];
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The GIL is released while a call runs: the window's thread keeps painting during a pass.
  using release = py::call_guard<py::gil_scoped_release>;
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dimension", release());
  m.def("linear", &linear, "low-bit linear: x [M, K] float32 -> [M, N] float32", release());
  m.def("rows", &rows, "dequantized weight rows for output indices", release());
  bind_decoder(m);
}
