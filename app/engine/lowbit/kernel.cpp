// Low-bit linear layers for the CPU: 2-, 3-, 4-, 5-, 6- or 8-bit unsigned weights with a scale and a min per
// group of G inputs (w = scale * q - min), both float16 ("plain") or int8 codes ("coded"), times activations quantized to int8 per row and per
// group. Integer dot products do the work: AVX-512 VNNI where the CPU has it, else AVX2 (most
// laptops: the same products in two 8-output halves of each tile, with the 256-bit VNNI
// instruction where the CPU has AVX-VNNI (Intel since Alder Lake), else with maddubs and madd;
// the same float steps, so every build gives bit-identical results). Every output element is
// computed by the same sequence of operations whatever the number of rows, so a token verified
// inside a batch gets exactly the logits it would get alone (batch invariance).
//
// Layout (see lowbit/packing.py, which also holds the pure-torch reference):
//   q      uint8  [N/16, K/G, L, 16, 4]  C = G/4 chunks of 4 inputs; 8-bit: L = C lines, one byte
//                                         per weight; 4-bit: L = C/2, chunk 2p in the low nibble and
//                                         chunk 2p+1 in the high nibble of line p; 6-bit: those C/2
//                                         lines of low nibbles, then C/4 lines of top bit pairs
//                                         (chunk 4h+j in bits 2j, 2j+1 of line C/2+h); 5-bit (G = 32
//                                         only): the nibbles, then C/8 lines of top bits (chunk 8h+j
//                                         in bit j of line C/2+h); 2-bit: C/4 lines of bit pairs
//                                         (chunk 4p+j in bits 2j, 2j+1 of line p); 3-bit: those C/4
//                                         lines, then C/8 lines of top bits (chunk 8h+j in bit j of
//                                         line C/4+h), for 8 chunks at a time: two groups of 16
//                                         (GGUF's Q3_K) share one unit of 3 lines, the second's
//                                         chunks after the first's.
//   scale       [N/16, K/G, 16]    fp16 (plain: 8 bits; 4 and 5 bits with G = 32) or int8 codes
//                                  (coded: 2, 3, 4, 5 and 6 bits)
//   min         [N/16, K/G, 16]    as scale, or [N/16, K/G, 0] when symmetric (always for 6 bits and
//                                  3 bits with G = 16; GGUF's Q3_K, Q4_0, Q5_0, Q8_0): min = 2^(bits-1) * scale
//   scale_step  [N/16, K/G/S, 16]  fp16: what a code of 1 stands for, per super-block of S groups
//   min_step    [N/16, K/G/S, 16]  (both empty when plain; min_step empty for 6 bits)
//   values      [N/16, 16] uint8   the 8-bit value each 4-bit integer stands for (GGUF's IQ4_NL and
//                                  IQ4_XS: w = scale * (values[q] - 128)), or [N/16, 0]
// A 32-bit lane of a 64-byte vector holds 4 consecutive inputs of one output, so one VNNI
// instruction advances 16 outputs by 4 inputs against 4 broadcast activation bytes.
#include "kernel.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace {

// How far ahead each weight stream is prefetched: into L1 (AVX-512), into L2 (AVX2, where 4 KB
// ahead is slower than 8).
constexpr int64_t kAheadBytes = 4096, kAheadBytesL2 = 8192;
// How AVX-512's first pass over the weights fetches them into L1: as non-temporal data
// (prefetchnta) on AMD's cores, where that makes one-row passes about 6% faster; as ordinary data
// (prefetcht0) elsewhere, since Intel's cores can stall the loop on non-temporal prefetches.
// kernel.py decides by the CPU's vendor.
#ifdef SPECCHAT_PREFETCH_NTA
constexpr int kFirstPassLocality = 0;
#else
constexpr int kFirstPassLocality = 3;
#endif

// One instantiation of the kernel: 4-input chunks per group (8 for groups of 32, 4 for 16) and
// the weight's format.
template <int Chunks, int Bits, bool Coded, bool Symmetric, bool Mapped>
struct Shape {
  static constexpr int kChunks = Chunks, kBits = Bits;
  static constexpr bool kCoded = Coded, kSymmetric = Symmetric, kMapped = Mapped;
};

// Calls f(Shape<...>{}) for a weight of one of the formats the kernel has: coded 2, 3, 4 and 5 bits
// with mins and 6 bits without, and 3 bits in groups of 16 without (Q3_K); plain 4, 5 and 8 bits,
// with mins (GGUF's Q4_1, Q5_1) or without (Q4_0, Q5_0, Q8_0); 4 bits through a table, plain
// (IQ4_NL) or coded (IQ4_XS), symmetric. 5-bit, plain 4-bit and mapped weights come in groups of 32
// only, 3-bit ones with mins too (check_params).
template <typename F>
void with_shape(int64_t bits, Format format, int64_t group, F&& f) {
#define SPECCHAT_32(B, C, S, M) f(Shape<8, B, C, S, M>{})
#define SPECCHAT_ANY(B, C, S, M) (group == 32 ? SPECCHAT_32(B, C, S, M) : f(Shape<4, B, C, S, M>{}))
  if (format.mapped) format.coded ? SPECCHAT_32(4, true, true, true) : SPECCHAT_32(4, false, true, true);
  else if (bits == 6) SPECCHAT_ANY(6, true, true, false);
  else if (format.coded && bits == 2) SPECCHAT_ANY(2, true, false, false);
  else if (format.coded && bits == 3) group == 32 ? SPECCHAT_32(3, true, false, false) : f(Shape<4, 3, true, true, false>{});
  else if (format.coded && bits == 4) SPECCHAT_ANY(4, true, false, false);
  else if (format.coded) SPECCHAT_32(5, true, false, false);
  else if (bits == 4) format.symmetric ? SPECCHAT_32(4, false, true, false) : SPECCHAT_32(4, false, false, false);
  else if (bits == 5) format.symmetric ? SPECCHAT_32(5, false, true, false) : SPECCHAT_32(5, false, false, false);
  else format.symmetric ? SPECCHAT_ANY(8, false, true, false) : SPECCHAT_ANY(8, false, false, false);
#undef SPECCHAT_ANY
#undef SPECCHAT_32
}

// Below 8 bits, an integer's low bits (a nibble, or a bit pair for 2 and 3 bits) and its top bits
// lie in separate lines (see the layout above).
constexpr int low_bits(int bits) { return bits >= 4 ? 4 : 2; }
constexpr int top_bits(int bits) { return bits - low_bits(bits); }

// 64-byte lines per group of `chunks` chunks (see the layout above).
constexpr int64_t lines_per_group(int64_t chunks, int64_t bits) {
  return bits == 8 ? chunks : chunks * low_bits(bits) / 8 + chunks * top_bits(bits) / 8;
}

// Chunks one unit of lines holds: a group's, but 8 for 3 bits, whose top bits fill a line only for
// 8 chunks (two groups of 16 share a unit; packing.layout_unit).
constexpr int unit_chunks(int chunks, int bits) { return bits == 3 ? 8 : chunks; }

// Checks the packed integers and parameters, every size the kernel indexes by included (a
// hostile or damaged file must be refused here, not read past its end); returns their format.
Format check_params(const at::Tensor& q, const at::Tensor& scale, const at::Tensor& min, const at::Tensor& scale_step,
                    const at::Tensor& min_step, const at::Tensor& values, int64_t group, int64_t bits) {
  TORCH_CHECK(group == 16 || group == 32, "group must be 16 or 32");
  TORCH_CHECK(bits >= 2 && bits <= 8 && bits != 7, "bits must be 2, 3, 4, 5, 6 or 8");
  TORCH_CHECK(bits != 5 || group == 32, "5-bit weights come in groups of 32");
  TORCH_CHECK(scale.dim() == 3 && scale.size(0) > 0 && scale.size(1) > 0 && scale.size(2) == kTile,
              "scales must be [tiles, groups, 16] with at least one tile and group");
  TORCH_CHECK(min.dim() == 3 && min.size(0) == scale.size(0) && min.size(1) == scale.size(1),
              "mins must be shaped as the scales, or [tiles, groups, 0]");
  TORCH_CHECK(scale_step.dim() == 3 && scale_step.size(0) == scale.size(0) && scale_step.size(2) == kTile &&
                  min_step.dim() == 3 && min_step.size(0) == scale.size(0) &&
                  (min_step.numel() == 0 || min_step.sizes() == scale_step.sizes()),
              "steps must be [tiles, super-blocks, 16], the mins' as the scales'");
  TORCH_CHECK(values.dim() == 2 && values.size(0) == scale.size(0), "a table of values must be [tiles, 16 or 0]");
  const int64_t inputs = scale.size(1) * group;
  TORCH_CHECK(bits != 3 || inputs % 32 == 0, "3-bit weights come in units of 32 inputs");
  TORCH_CHECK(q.scalar_type() == at::kByte && q.is_contiguous() && q.numel() == scale.size(0) * inputs * bits * 2,
              "the packed integers must be uint8, contiguous, bits / 8 bytes per weight of [tiles * 16, groups * group]");
  const bool coded = scale.scalar_type() == at::kChar;
  TORCH_CHECK((coded || scale.scalar_type() == at::kHalf) && min.scalar_type() == scale.scalar_type(),
              "scales and mins must be float16 or int8 codes");
  TORCH_CHECK(coded ? bits != 8 : bits > 3 && bits != 6 && (bits == 8 || group == 32),
              "coded scales are for 2, 3, 4, 5 and 6 bits, float16 ones for 8 bits and 4 or 5 bits in groups of 32");
  TORCH_CHECK(!coded || (scale_step.scalar_type() == at::kHalf && scale_step.size(1) > 0 &&
                         scale.size(1) % scale_step.size(1) == 0),
              "coded scales need float16 steps per super-block");
  const bool symmetric = min.size(2) == 0;
  TORCH_CHECK(symmetric || min.size(2) == scale.size(2), "mins must be stored for every group or for none");
  const bool mapped = values.dim() == 2 && values.size(1) > 0;
  TORCH_CHECK(!mapped || (bits == 4 && group == 32 && symmetric && values.scalar_type() == at::kByte &&
                          values.size(0) == scale.size(0) && values.size(1) == kTile),
              "a table of values is for symmetric 4-bit weights in groups of 32, 16 uint8 values per tile");
  const bool always_symmetric = mapped || bits == 6 || (bits == 3 && group == 16);
  TORCH_CHECK(always_symmetric ? symmetric : !coded || (!symmetric && min_step.numel() == scale_step.numel()),
              "6-bit, 3-bit groups of 16 and mapped weights have no mins; other coded 2- to 5-bit ones need their mins and steps");
  for (const at::Tensor& t : {scale, min, scale_step, min_step, values}) TORCH_CHECK(t.is_contiguous(), "packed tensors must be contiguous");
  return {coded, symmetric, mapped};
}

// One group of activations quantized: its int8 step and the sum of its int8 values.
struct GroupQuantized {
  float step;
  int32_t sum;
};

#if defined(__AVX512VNNI__) && !defined(SPECCHAT_VNNI256)
// Rows per register block of the pair (x 2 tiles x 2 accumulators: 20 of the 32 registers; 6 rows spilled them)
constexpr int kMaxRows = 5;
// Rows one tile alone takes in one block (7 x 2 registers; more rows go in pair blocks, see rows_kernel)
constexpr int kTileRows = 7;

// One group of activations as int8, 16 values per instruction (see quantize_rows): q [group];
// returns the group's step and the sum of its int8 values.
inline GroupQuantized quantize_group(const float* v, int64_t group, int8_t* q) {
  __m512 largest = _mm512_setzero_ps();
  for (int64_t j = 0; j < group; j += 16) largest = _mm512_max_ps(largest, _mm512_abs_ps(_mm512_loadu_ps(v + j)));
  const float amax = _mm512_reduce_max_ps(largest);
  const __m512 inverse = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  __m512i sum = _mm512_setzero_si512();
  for (int64_t j = 0; j < group; j += 16) {
    // the default rounding mode: to nearest, ties to even, as std::nearbyint and torch.round
    const __m512i value = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + j), inverse));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j), _mm512_cvtepi32_epi8(value));
    sum = _mm512_add_epi32(sum, value);
  }
  return {amax / 127.f, _mm512_reduce_add_epi32(sum)};
}

inline __m512i broadcast4(const int8_t* p) {
  int32_t word;
  std::memcpy(&word, p, 4);
  return _mm512_set1_epi32(word);
}

// The unsigned weights of one 4-input chunk of 16 outputs (see packing.pack for the lines):
// 8-bit: the line itself; 4-bit: a nibble of line chunk/2 (mapped: its entry in `table`, the
// tile's 16 values in each 128-bit lane); 5- and 6-bit: that nibble plus the chunk's one or two
// top bits from the lines after the nibbles; 2-bit: a bit pair of line chunk/4 (3-bit: plus its
// top bit).
template <int Chunks, int Bits, bool Mapped>
inline __m512i chunk_weights(const uint8_t* lines, int chunk, __m512i table) {
  const __m512i* line = reinterpret_cast<const __m512i*>(lines);
  if constexpr (Bits == 8) return _mm512_loadu_si512(line + chunk);
  constexpr int kLowBits = low_bits(Bits), kTopBits = top_bits(Bits), kLowPerLine = 8 / kLowBits;
  const __m512i packed = _mm512_loadu_si512(line + chunk / kLowPerLine);
  const int low_at = kLowBits * (chunk % kLowPerLine);
  __m512i value = _mm512_and_si512(low_at ? _mm512_srli_epi16(packed, low_at) : packed,
                                   _mm512_set1_epi8((1 << kLowBits) - 1));
  if constexpr (kTopBits > 0) {
    constexpr int kPerLine = 8 / kTopBits;
    const __m512i tops = _mm512_loadu_si512(line + Chunks * kLowBits / 8 + chunk / kPerLine);
    const int at = kTopBits * (chunk % kPerLine);  // the chunk's top bits, moved above its low bits
    const __m512i moved = at < kLowBits ? _mm512_slli_epi16(tops, kLowBits - at)
                                        : (at > kLowBits ? _mm512_srli_epi16(tops, at - kLowBits) : tops);
    value = _mm512_or_si512(value, _mm512_and_si512(moved, _mm512_set1_epi8(((1 << kTopBits) - 1) << kLowBits)));
  }
  if constexpr (Mapped) return _mm512_shuffle_epi8(table, value);
  return value;
}

// A tile's 16 values in every 128-bit lane (zero when not mapped).
inline __m512i value_table(const uint8_t* values) {
  return values ? _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values))) : _mm512_setzero_si512();
}

inline __m512 load_halves(const at::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The 16 outputs' values of group g: float16 as stored, or code times its super-block's step
// (one float32 product, as packing.group_params computes it).
template <bool Coded>
inline __m512 group_values(const void* values, __m512 step, int64_t g) {
  if constexpr (!Coded) {
    return load_halves(static_cast<const at::Half*>(values) + g * kTile);
  } else {
    const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(values) + g * kTile));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes)), step);
  }
}

// One or two 16-output tiles against `Rows` activation rows, over all K (with two, each broadcast
// activation word feeds both tiles, which halves the broadcasts of a larger batch).
// The arithmetic of each output is the same whatever Rows is: batch invariance.
// Never inlined: each instantiation keeps its own register allocation (inlined into the
// dispatching loop, the 6-bit ones ran 1.4x slower on 8 rows).
//
// Tiles: 2, the pair; 1, the tile at q alone (p1 unused), one stream of weights and of params that
// runs on into the next tile. pass: which of the `passes` passes over this pair (a block of rows
// each) this is; they decide what is prefetched. A thread's pairs lie one after the other in
// memory, as do their scales and mins.
template <int Tiles, int Rows, int Chunks, int Bits, bool Coded, bool Symmetric, bool Mapped>
__attribute__((noinline)) void tile_pair_kernel(const uint8_t* q, int64_t tile_bytes, const TileParams& p0,
                                                const TileParams& p1, int64_t groups, int64_t per_step, int pass,
                                                int passes, const Activations& act, float* out, int64_t out_stride) {
  constexpr int kUnitChunks = unit_chunks(Chunks, Bits), kGroupsPerUnit = kUnitChunks / Chunks;
  constexpr int64_t kUnitBytes = lines_per_group(kUnitChunks, Bits) * 64, kGroupBytes = kUnitBytes / kGroupsPerUnit;
  constexpr int kValueBits = Mapped ? 8 : Bits;  // the width of what the integers stand for
  constexpr int32_t kOffset = 1 << (kValueBits - 1);  // symmetric: w = scale * (value - kOffset), no min stored
  // With one or two rows, a single accumulator per tile would chain every dot product of the
  // group on the previous one (latency bound); even and odd chunks then go to separate ones.
  constexpr int kChains = Rows <= 2 ? 2 : 1;
  constexpr int64_t kParamBytes = Coded ? 1 : 2;  // per output and group
  constexpr int64_t kAhead = std::max<int64_t>(1, kAheadBytes / kGroupBytes);  // in groups
  const uint8_t* q1 = q + tile_bytes;
  __m512 acc0[Rows], acc1[Rows];
  for (int r = 0; r < Rows; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();  // acc1 unused with one tile
  const TileParams tile0 = p0, tile1 = p1;  // local copies: no aliasing with the output
  const __m512i table0 = value_table(tile0.values), table1 = value_table(tile1.values);
  __m512 scale_step0, scale_step1, min_step0, min_step1;  // the current super-block's steps
  int64_t super_block = 0, in_super_block = 0;
  for (int64_t g = 0; g < groups; ++g) {
    if constexpr (Coded) {
      if (in_super_block == 0) {
        scale_step0 = load_halves(tile0.scale_step + super_block * kTile);
        if constexpr (Tiles == 2) scale_step1 = load_halves(tile1.scale_step + super_block * kTile);
        if constexpr (!Symmetric) {
          min_step0 = load_halves(tile0.min_step + super_block * kTile);
          if constexpr (Tiles == 2) min_step1 = load_halves(tile1.min_step + super_block * kTile);
        }
      }
    }
    // Prefetch. A first pass fetches about kAheadBytes ahead on each stream (weights, scales,
    // mins) into L1 (see kFirstPassLocality). One tile's streams run on into the next tile's; a
    // pair's tile 1's streams run on into the next pair's tile 0, tile 0's jump to the next pair's
    // tile 1 once its own groups run out.
    // More than 7 rows take several passes over the pair, the later ones from the caches: every
    // pass fetches its share of the next pair into L2 meanwhile (pass p of P the p-th P-th of its
    // groups, spread over the pass), so that DRAM works all the time the arithmetic does (one
    // pass fetching the whole next pair would leave DRAM idle during the others).
    // Prefetches never fault, so the last pair's look past its end is harmless.
    // locality: __builtin_prefetch's (0: non-temporal, prefetchnta; 2: prefetcht1, into L2; 3: prefetcht0)
    // (inlined: a call here would spill every live vector register around it, all caller-saved)
    const auto prefetch = [&](auto locality, int64_t g_ahead) __attribute__((always_inline)) {  // g_ahead: counted from this pair's tile 0
      const auto fetch = [](const void* p) __attribute__((always_inline)) { __builtin_prefetch(p, 0, decltype(locality)::value); };
      const int64_t tile_params = groups * kTile * kParamBytes;
      const bool own = Tiles == 1 || g_ahead < groups;  // tile 0's stream still in this pair
      const int64_t at = own ? g_ahead : g_ahead - groups;  // group in the tile the streams reach
      const uint8_t* lines0 = (own ? q : q + 3 * tile_bytes) + at * kGroupBytes;
      const uint8_t* lines1 = q1 + g_ahead * kGroupBytes;
      for (int64_t line = 0; line < kGroupBytes; line += 64) {
        fetch(lines0 + line);
        if constexpr (Tiles == 2) fetch(lines1 + line);
      }
      if ((at * kTile * kParamBytes) % 64 == 0) {  // a new cache line of scales (and mins)
        const int64_t at0 = (own ? 0 : 3 * tile_params) + at * kTile * kParamBytes;
        const int64_t at1 = g_ahead * kTile * kParamBytes;
        fetch(static_cast<const char*>(tile0.scale) + at0);
        if constexpr (Tiles == 2) fetch(static_cast<const char*>(tile1.scale) + at1);
        if constexpr (!Symmetric) {
          fetch(static_cast<const char*>(tile0.min) + at0);
          if constexpr (Tiles == 2) fetch(static_cast<const char*>(tile1.min) + at1);
        }
      }
    };
    if (pass == 0) prefetch(std::integral_constant<int, kFirstPassLocality>{}, g + kAhead);
    if (const int64_t at = pass * groups + g; passes > 1 && at % passes == 0) {
      prefetch(std::integral_constant<int, 2>{}, groups + at / passes);
    }
    __m512i dot0[kChains][Rows], dot1[kChains][Rows];
    for (int c = 0; c < kChains; ++c) {
      for (int r = 0; r < Rows; ++r) {
        // Symmetric weights: the dot product starts at -kOffset * (sum of the activations),
        // which subtracts the offset exactly, in integers.
        const int32_t start = Symmetric && c == 0 ? -kOffset * act.sum[r * groups + g] : 0;
        dot0[c][r] = dot1[c][r] = _mm512_set1_epi32(start);
      }
    }
    const int8_t* a = act.q + g * Chunks * 4;
    const uint8_t* lines0 = q + g / kGroupsPerUnit * kUnitBytes;  // the group's unit
    const uint8_t* lines1 = q1 + g / kGroupsPerUnit * kUnitBytes;
    // One chunk's products for every row, the chunk FIRST + chunk of its unit (a macro, so that
    // the loop below can be unrolled for 5 bits alone and the other widths compile exactly as they
    // were measured).
#define SPECCHAT_CHUNK_PRODUCTS(FIRST)                                                                      \
  {                                                                                                         \
    const __m512i w0 = chunk_weights<kUnitChunks, Bits, Mapped>(lines0, (FIRST) + chunk, table0);           \
    const __m512i w1 = Tiles == 2 ? chunk_weights<kUnitChunks, Bits, Mapped>(lines1, (FIRST) + chunk, table1) : w0; \
    const int chain = chunk % kChains;                                               \
    for (int r = 0; r < Rows; ++r) {                                                 \
      const __m512i word = broadcast4(a + r * act.k + 4 * chunk);                    \
      dot0[chain][r] = _mm512_dpbusd_epi32(dot0[chain][r], w0, word);                \
      if constexpr (Tiles == 2) dot1[chain][r] = _mm512_dpbusd_epi32(dot1[chain][r], w1, word); \
    }                                                                                \
  }
    // Unrolled below 4 bits and for 5, so that each chunk's shifts are constants: GCC kept this
    // loop rolled, and 64 rows took 1.21-1.26x the 4-bit time instead of 1.02-1.11x (three
    // alternating runs, 5 bits). The second group of 16 in a 3-bit unit takes its chunks 4-7.
#define SPECCHAT_CHUNK_LOOP(FIRST)                                                      \
  if constexpr (Bits == 5 || Bits < 4) {                                                \
    _Pragma("GCC unroll 8") for (int chunk = 0; chunk < Chunks; ++chunk) SPECCHAT_CHUNK_PRODUCTS(FIRST) \
  } else {                                                                              \
    for (int chunk = 0; chunk < Chunks; ++chunk) SPECCHAT_CHUNK_PRODUCTS(FIRST)         \
  }
    if constexpr (kGroupsPerUnit == 2) {
      if (g % 2) {
        SPECCHAT_CHUNK_LOOP(Chunks)
      } else {
        SPECCHAT_CHUNK_LOOP(0)
      }
    } else {
      SPECCHAT_CHUNK_LOOP(0)
    }
#undef SPECCHAT_CHUNK_LOOP
#undef SPECCHAT_CHUNK_PRODUCTS
    for (int c = 1; c < kChains; ++c) {
      for (int r = 0; r < Rows; ++r) {
        dot0[0][r] = _mm512_add_epi32(dot0[0][r], dot0[c][r]);
        if constexpr (Tiles == 2) dot1[0][r] = _mm512_add_epi32(dot1[0][r], dot1[c][r]);
      }
    }
    const __m512 w_scale0 = group_values<Coded>(tile0.scale, scale_step0, g);
    const __m512 w_scale1 = Tiles == 2 ? group_values<Coded>(tile1.scale, scale_step1, g) : w_scale0;
    for (int r = 0; r < Rows; ++r) {
      const __m512 a_step = _mm512_set1_ps(act.step[r * groups + g]);
      acc0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot0[0][r]), _mm512_mul_ps(w_scale0, a_step), acc0[r]);
      if constexpr (Tiles == 2) acc1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot1[0][r]), _mm512_mul_ps(w_scale1, a_step), acc1[r]);
    }
    if constexpr (!Symmetric) {
      const __m512 w_min0 = group_values<Coded>(tile0.min, min_step0, g);
      const __m512 w_min1 = Tiles == 2 ? group_values<Coded>(tile1.min, min_step1, g) : w_min0;
      for (int r = 0; r < Rows; ++r) {
        const __m512 a_sum = _mm512_set1_ps(act.scaled_sum[r * groups + g]);
        acc0[r] = _mm512_fnmadd_ps(w_min0, a_sum, acc0[r]);
        if constexpr (Tiles == 2) acc1[r] = _mm512_fnmadd_ps(w_min1, a_sum, acc1[r]);
      }
    }
    if (++in_super_block == per_step) {
      in_super_block = 0;
      ++super_block;
    }
  }
  for (int r = 0; r < Rows; ++r) {
    _mm512_storeu_ps(out + r * out_stride, acc0[r]);
    if constexpr (Tiles == 2) _mm512_storeu_ps(out + r * out_stride + kTile, acc1[r]);
  }
}

// A block of rows against the pair: with one block (up to kTileRows rows: every decoding step and
// most verifications) each tile on its own, one after the other, so that a thread reads one
// stream of weights (10-20% faster than the pair at once for 1 to 7 rows); from 8 rows on the
// tiles alone are no faster (their broadcasts double). The blocks of a larger batch (3 to 5 rows each: near-equal blocks of at
// most 5) take the pair at once, so that each broadcast activation feeds two tiles.
template <int Chunks, int Bits, bool Coded, bool Symmetric, bool Mapped>
void rows_kernel(int rows, const uint8_t* q, int64_t tile_bytes, const TileParams& p0, const TileParams& p1,
                 int64_t groups, int64_t per_step, int pass, int passes, const Activations& act, float* out,
                 int64_t out_stride) {
#define SPECCHAT_TILES(R)                                                                                             \
  case R:                                                                                                             \
    tile_pair_kernel<1, R, Chunks, Bits, Coded, Symmetric, Mapped>(q, tile_bytes, p0, p0, groups, per_step, pass,      \
                                                                   passes, act, out, out_stride);                     \
    tile_pair_kernel<1, R, Chunks, Bits, Coded, Symmetric, Mapped>(q + tile_bytes, tile_bytes, p1, p1, groups,         \
                                                                   per_step, pass, passes, act, out + kTile, out_stride); \
    return;
#define SPECCHAT_PAIR(R)                                                                                           \
  case R:                                                                                                          \
    return tile_pair_kernel<2, R, Chunks, Bits, Coded, Symmetric, Mapped>(q, tile_bytes, p0, p1, groups, per_step, \
                                                                          pass, passes, act, out, out_stride);
  if (passes == 1) {
    switch (rows) {
      SPECCHAT_TILES(1) SPECCHAT_TILES(2) SPECCHAT_TILES(3) SPECCHAT_TILES(4) SPECCHAT_TILES(5) SPECCHAT_TILES(6) SPECCHAT_TILES(7)
    }
  } else {
    switch (rows) { SPECCHAT_PAIR(3) SPECCHAT_PAIR(4) SPECCHAT_PAIR(5) }
  }
#undef SPECCHAT_PAIR
#undef SPECCHAT_TILES
}

// Output tiles t and t + 1 of every row: out [rows, n] gets their 32 columns.
void pair_products(int64_t t, int rows, const uint8_t* q, int64_t tile_bytes, const WeightParams& params,
                   int64_t group, int64_t bits, Format format, const Activations& act, float* out, int64_t n) {
  const TileParams p0 = params.tile(t), p1 = params.tile(t + 1);
  const int64_t groups = params.groups;
  // Up to kTileRows rows in one block; more in blocks of near-equal size (8 rows as 4 + 4, not 5 +
  // 3): each block unpacks the weights again, and a small block pays that for few rows.
  const int blocks = rows <= kTileRows ? 1 : (rows + kMaxRows - 1) / kMaxRows;
  for (int r0 = 0, pass = 0; r0 < rows; ++pass) {
    const int block = (rows - r0 + (blocks - pass) - 1) / (blocks - pass);
    const uint8_t* tq = q + t * tile_bytes;
    const Activations block_act = act.from_row(r0, groups);
    float* to = out + r0 * n + t * kTile;
    with_shape(bits, format, group, [&](auto shape) {
      using S = decltype(shape);
      rows_kernel<S::kChunks, S::kBits, S::kCoded, S::kSymmetric, S::kMapped>(block, tq, tile_bytes, p0, p1, groups,
                                                                             params.per_step, pass, blocks, block_act, to, n);
    });
    r0 += block;
  }
}

#else  // AVX2, with or without 256-bit VNNI
constexpr int kMaxRows = 2;  // rows per register block (x 2 halves: accumulators and sums in 16 registers)

#ifdef SPECCHAT_VNNI256
constexpr bool kVnni = true;

// acc + the products of 4 unsigned weights and 4 signed activations per 32-bit lane, exact. The
// AVX-VNNI encoding where the CPU has it; the build for tests uses AVX-512's encoding of the same
// instruction (AVX512-VL), so that this very kernel also runs, and is checked, on AVX-512 CPUs.
inline __m256i dot4(__m256i acc, __m256i weights, __m256i activations) {
#ifdef __AVXVNNI__
  return _mm256_dpbusd_avx_epi32(acc, weights, activations);
#else
  return _mm256_dpbusd_epi32(acc, weights, activations);
#endif
}
#else
constexpr bool kVnni = false;
#endif

// As the AVX-512 quantize_group, 8 values at a time: the same max |x|, divisions and rounding.
inline GroupQuantized quantize_group(const float* v, int64_t group, int8_t* q) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 largest = _mm256_setzero_ps();
  for (int64_t j = 0; j < group; j += 8) largest = _mm256_max_ps(largest, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + j)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, largest);
  const float amax = *std::max_element(lanes, lanes + 8);
  const __m256 inverse = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  __m256i sum = _mm256_setzero_si256();
  for (int64_t j = 0; j < group; j += 8) {
    // the default rounding mode: to nearest, ties to even, as std::nearbyint and torch.round
    const __m256i value = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + j), inverse));
    alignas(32) int32_t values[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(values), value);
    for (int b = 0; b < 8; ++b) q[j + b] = static_cast<int8_t>(values[b]);  // within +-127
    sum = _mm256_add_epi32(sum, value);
  }
  alignas(32) int32_t sums[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(sums), sum);
  int32_t total = 0;
  for (int b = 0; b < 8; ++b) total += sums[b];
  return {amax / 127.f, total};
}

// Half `half` (outputs 8 * half .. 8 * half + 7) of a chunk's unsigned weights: the bytes of
// the AVX-512 chunk_weights, 32 at a time.
template <int Chunks, int Bits, bool Mapped>
inline __m256i chunk_weights(const uint8_t* lines, int chunk, int half, __m256i table) {
  const auto line = [&](int i) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lines + i * 64 + half * 32)); };
  if constexpr (Bits == 8) return line(chunk);
  constexpr int kLowBits = low_bits(Bits), kTopBits = top_bits(Bits), kLowPerLine = 8 / kLowBits;
  const __m256i packed = line(chunk / kLowPerLine);
  const int low_at = kLowBits * (chunk % kLowPerLine);
  __m256i value = _mm256_and_si256(low_at ? _mm256_srli_epi16(packed, low_at) : packed,
                                   _mm256_set1_epi8((1 << kLowBits) - 1));
  if constexpr (kTopBits > 0) {
    constexpr int kPerLine = 8 / kTopBits;
    const __m256i tops = line(Chunks * kLowBits / 8 + chunk / kPerLine);
    const int at = kTopBits * (chunk % kPerLine);  // the chunk's top bits, moved above its low bits
    const __m256i moved = at < kLowBits ? _mm256_slli_epi16(tops, kLowBits - at)
                                        : (at > kLowBits ? _mm256_srli_epi16(tops, at - kLowBits) : tops);
    value = _mm256_or_si256(value, _mm256_and_si256(moved, _mm256_set1_epi8(((1 << kTopBits) - 1) << kLowBits)));
  }
  if constexpr (Mapped) return _mm256_shuffle_epi8(table, value);
  return value;
}

// A tile's 16 values in both 128-bit lanes (zero when not mapped).
inline __m256i value_table(const uint8_t* values) {
  return values ? _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values))) : _mm256_setzero_si256();
}

// Per 16-bit lane, the sum of 2 products of unsigned weights and signed activations (maddubs).
// Its pair sums saturate at 16 bits: 4- and 6-bit weights stay below (63 * 127 * 2 < 32767);
// 8-bit weights are taken as w - 128 (signed; the caller adds 128 * the sum of the
// activations), whose pairs reach at most 128 * 127 * 2.
template <int Bits>
inline __m256i pair_sums(__m256i weights, __m256i activations) {
  if constexpr (Bits == 8) {
    const __m256i centred = _mm256_xor_si256(weights, _mm256_set1_epi8(static_cast<char>(0x80)));
    return _mm256_maddubs_epi16(_mm256_abs_epi8(centred), _mm256_sign_epi8(activations, centred));
  }
  return _mm256_maddubs_epi16(weights, activations);
}

// Chunks whose pair sums add up in 16 bits before madd widens them into the 32-bit lanes (the
// sums of 4 inputs VNNI gives): exact while every partial sum stays below 32767. 2- to 4-bit: a
// group of 8 chunks is at most 8 * 2 * 15 * 127 = 30480; 5-bit: 4 chunks 4 * 2 * 31 * 127 = 31496;
// 6-bit: 2 chunks 2 * 2 * 63 * 127 = 32004; 8-bit: 1.
template <int Bits, int Chunks>
constexpr int kChunksPerWidening = Bits <= 4 ? Chunks : (Bits == 5 ? 4 : (Bits == 6 ? 2 : 1));

inline __m256 load_halves(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The 8 outputs' values of group g in half `half`, as the AVX-512 group_values.
template <bool Coded>
inline __m256 group_values(const void* values, __m256 step, int64_t g, int half) {
  if constexpr (!Coded) {
    return load_halves(static_cast<const at::Half*>(values) + g * kTile + half * 8);
  } else {
    const int8_t* codes = static_cast<const int8_t*>(values) + g * kTile + half * 8;
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)))), step);
  }
}

// Where a block of rows takes the tile's weights: kUnpack unpacks them; kUnpackAndKeep also stores
// them in `kept` (K x 16 bytes, in the order they are used); kKept reads them from there (see
// tile_rows).
enum WeightSource { kUnpack, kUnpackAndKeep, kKept };

// One 16-output tile against `Rows` activation rows, over all K, in two halves of 8 outputs.
// Every output gets the AVX-512 kernel's integers and float steps, in the same order: the same
// bits, and batch invariance. Never inlined, as there.
template <int Rows, int Chunks, int Bits, bool Coded, bool Symmetric, bool Mapped, WeightSource Weights>
__attribute__((noinline)) void tile_kernel(const uint8_t* q, const TileParams& tile, int64_t groups, int64_t per_step,
                                           const Activations& act, float* out, int64_t out_stride, uint8_t* kept) {
  constexpr int kUnitChunks = unit_chunks(Chunks, Bits), kGroupsPerUnit = kUnitChunks / Chunks;
  constexpr int64_t kUnitBytes = lines_per_group(kUnitChunks, Bits) * 64, kGroupBytes = kUnitBytes / kGroupsPerUnit;
  constexpr int kValueBits = Mapped ? 8 : Bits;  // the width of what the integers stand for
  constexpr int32_t kOffset = 1 << (kValueBits - 1);  // symmetric: w = scale * (value - kOffset), no min stored
  constexpr int64_t kAhead = std::max<int64_t>(1, kAheadBytesL2 / kGroupBytes);  // in groups
  const __m256i table = value_table(tile.values);
  __m256 acc[Rows][2];
  for (int r = 0; r < Rows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  __m256 scale_step[2], min_step[2];
  int64_t super_block = 0, in_super_block = 0;
  for (int64_t g = 0; g < groups; ++g) {
    if constexpr (Coded) {
      if (in_super_block == 0) {
        for (int h = 0; h < 2; ++h) {
          scale_step[h] = load_halves(tile.scale_step + super_block * kTile + h * 8);
          if constexpr (!Symmetric) min_step[h] = load_halves(tile.min_step + super_block * kTile + h * 8);
        }
      }
    }
    const uint8_t* lines = q + g / kGroupsPerUnit * kUnitBytes;  // the group's unit
    const int first = g % kGroupsPerUnit * Chunks;  // its first chunk there
    if constexpr (Weights != kKept) {
      for (int64_t line = 0; line < kGroupBytes; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(q + (g + kAhead) * kGroupBytes + line), _MM_HINT_T1);
      }
    }
    int32_t start[Rows];
    for (int r = 0; r < Rows; ++r) {
      // Symmetric weights start at -kOffset * (sum of the activations); without VNNI 8-bit ones
      // at +128 * it more (see pair_sums)
      start[r] = (Symmetric ? -kOffset * act.sum[r * groups + g] : 0) + (kValueBits == 8 && !kVnni ? 128 * act.sum[r * groups + g] : 0);
    }
    // Set at the first chunk (VNNI) or widening: with one widening per group (4 bits) no
    // register holds it meanwhile
    __m256i dot[Rows][2];
    const int8_t* a = act.q + g * Chunks * 4;
#ifndef SPECCHAT_VNNI256
    constexpr int kWiden = kChunksPerWidening<kValueBits, Chunks>;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i pairs[Rows][2];  // 16-bit sums of the chunks since the last widening
#endif
    for (int chunk = 0; chunk < Chunks; ++chunk) {
      __m256i w0, w1;
      if constexpr (Weights == kKept) {
        const __m256i* keep = reinterpret_cast<const __m256i*>(kept + (g * Chunks + chunk) * 64);
        w0 = _mm256_load_si256(keep);
        w1 = _mm256_load_si256(keep + 1);
      } else {
        w0 = chunk_weights<kUnitChunks, Bits, Mapped>(lines, first + chunk, 0, table);
        w1 = chunk_weights<kUnitChunks, Bits, Mapped>(lines, first + chunk, 1, table);
        if constexpr (Weights == kUnpackAndKeep) {
          __m256i* keep = reinterpret_cast<__m256i*>(kept + (g * Chunks + chunk) * 64);
          _mm256_store_si256(keep, w0);
          _mm256_store_si256(keep + 1, w1);
        }
      }
      for (int r = 0; r < Rows; ++r) {
        int32_t word;
        std::memcpy(&word, a + r * act.k + 4 * chunk, 4);
        const __m256i activations = _mm256_set1_epi32(word);
#ifdef SPECCHAT_VNNI256
        for (int h = 0; h < 2; ++h) {
          const __m256i before = chunk == 0 ? _mm256_set1_epi32(start[r]) : dot[r][h];
          dot[r][h] = dot4(before, h ? w1 : w0, activations);
        }
#else
        const __m256i p0 = pair_sums<kValueBits>(w0, activations), p1 = pair_sums<kValueBits>(w1, activations);
        pairs[r][0] = chunk % kWiden ? _mm256_add_epi16(pairs[r][0], p0) : p0;
        pairs[r][1] = chunk % kWiden ? _mm256_add_epi16(pairs[r][1], p1) : p1;
        if (chunk % kWiden == kWiden - 1) {
          for (int h = 0; h < 2; ++h) {
            const __m256i before = chunk == kWiden - 1 ? _mm256_set1_epi32(start[r]) : dot[r][h];
            dot[r][h] = _mm256_add_epi32(before, _mm256_madd_epi16(pairs[r][h], ones));
          }
        }
#endif
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 w_scale = group_values<Coded>(tile.scale, scale_step[h], g, h);
      for (int r = 0; r < Rows; ++r) {
        const __m256 a_step = _mm256_set1_ps(act.step[r * groups + g]);
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][h]), _mm256_mul_ps(w_scale, a_step), acc[r][h]);
      }
      if constexpr (!Symmetric) {
        const __m256 w_min = group_values<Coded>(tile.min, min_step[h], g, h);
        for (int r = 0; r < Rows; ++r) {
          acc[r][h] = _mm256_fnmadd_ps(w_min, _mm256_set1_ps(act.scaled_sum[r * groups + g]), acc[r][h]);
        }
      }
    }
    if (++in_super_block == per_step) {
      in_super_block = 0;
      ++super_block;
    }
  }
  for (int r = 0; r < Rows; ++r) {
    _mm256_storeu_ps(out + r * out_stride, acc[r][0]);
    _mm256_storeu_ps(out + r * out_stride + 8, acc[r][1]);
  }
}

// A tile against every row, kMaxRows at a time. Each block would unpack the weights again: for
// 2-, 3-, 5- and 6-bit weights, whose unpacking takes several steps, the first block keeps them
// unpacked (K x 16 bytes, within L2) and the others read them, which roughly halves the time of
// 3-bit tiles. 4-bit weights, a shift and a mask, gain nothing from it.
template <int Chunks, int Bits, bool Coded, bool Symmetric, bool Mapped>
void tile_rows(int rows, const uint8_t* q, const TileParams& tile, int64_t groups, int64_t per_step,
               const Activations& act, float* out, int64_t out_stride) {
  constexpr bool kKeep = Bits != 4 && Bits != 8;
  uint8_t* kept = nullptr;
  if (kKeep && rows > kMaxRows) {
    thread_local std::vector<__m256i> buffer;  // 32-byte aligned
    buffer.resize(std::max<size_t>(buffer.size(), groups * Chunks * 2));
    kept = reinterpret_cast<uint8_t*>(buffer.data());
  }
  for (int r0 = 0; r0 < rows; r0 += kMaxRows) {
    const auto block = [&](auto source) {
      constexpr WeightSource kSource = decltype(source)::value;
      const Activations block_act = act.from_row(r0, groups);
      float* to = out + r0 * out_stride;
      if (rows - r0 == 1) {
        tile_kernel<1, Chunks, Bits, Coded, Symmetric, Mapped, kSource>(q, tile, groups, per_step, block_act, to,
                                                                          out_stride, kept);
      } else {
        tile_kernel<2, Chunks, Bits, Coded, Symmetric, Mapped, kSource>(q, tile, groups, per_step, block_act, to,
                                                                          out_stride, kept);
      }
    };
    if constexpr (kKeep) {
      if (kept != nullptr) {
        r0 == 0 ? block(std::integral_constant<WeightSource, kUnpackAndKeep>{})
                : block(std::integral_constant<WeightSource, kKept>{});
        continue;
      }
    }
    block(std::integral_constant<WeightSource, kUnpack>{});
  }
}

// Output tiles t and t + 1 of every row: out [rows, n] gets their 32 columns.
void pair_products(int64_t t, int rows, const uint8_t* q, int64_t tile_bytes, const WeightParams& params,
                   int64_t group, int64_t bits, Format format, const Activations& act, float* out, int64_t n) {
  for (int64_t tile = t; tile < t + 2; ++tile) {
    with_shape(bits, format, group, [&](auto shape) {
      using S = decltype(shape);
      tile_rows<S::kChunks, S::kBits, S::kCoded, S::kSymmetric, S::kMapped>(
          rows, q + tile * tile_bytes, params.tile(tile), params.groups, params.per_step, act, out + tile * kTile, n);
    });
  }
}
#endif

struct QuantizedRows {
  at::Tensor q;           // int8 [M, K]
  at::Tensor scale;       // float [M, K/G]: int8 step of each group
  at::Tensor scaled_sum;  // float [M, K/G]: scale * (sum of the group's int8 values)
  at::Tensor sum;         // int32 [M, K/G]: sum of the group's int8 values

  QuantizedView view() {
    return {q.data_ptr<int8_t>(), scale.data_ptr<float>(), scaled_sum.data_ptr<float>(), sum.data_ptr<int32_t>(),
            q.size(1)};
  }
};

// Symmetric int8 per row and group, groups shared between threads (see quantize_groups).
QuantizedRows quantize_rows(const at::Tensor& x, int64_t group) {
  const int64_t rows = x.size(0), k = x.size(1), groups = k / group;
  QuantizedRows out{at::empty({rows, k}, at::kChar), at::empty({rows, groups}, at::kFloat),
                    at::empty({rows, groups}, at::kFloat), at::empty({rows, groups}, at::kInt)};
  const QuantizedView view = out.view();
  const float* src = x.data_ptr<float>();
  at::parallel_for(0, rows * groups, 1024, [&](int64_t begin, int64_t end) { quantize_groups(src, group, begin, end, view); });
  return out;
}

}  // namespace

// x [M, K] float32 -> [M, N] float32
at::Tensor linear(at::Tensor x, at::Tensor q, at::Tensor scale, at::Tensor min, at::Tensor scale_step,
                  at::Tensor min_step, at::Tensor values, int64_t group, int64_t bits) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be [M, K] float32");
  const PreparedWeight weight(Projection{q, scale, min, scale_step, min_step, values, std::nullopt, group, bits, 0});
  x = x.contiguous();
  const int64_t rows = x.size(0), k = x.size(1), tiles = 2 * weight.pairs;
  TORCH_CHECK(k % group == 0 && weight.params.groups == k / group, "K does not match the packed weight");
  QuantizedRows act = quantize_rows(x, group);
  at::Tensor out = at::empty({rows, tiles * kTile}, at::kFloat);
  const Activations all_rows = act.view().activations();
  float* out_ptr = out.data_ptr<float>();
  std::vector<PairRange> ranges(at::get_num_threads());
#pragma omp parallel num_threads(ranges.size())
  {
    const int thread = omp_get_thread_num(), threads = omp_get_num_threads();
#pragma omp single
    share_pairs(weight.pairs, ranges.data(), threads);
    take_pairs(ranges.data(), thread, threads, weight.pairs, [&](int64_t first, int64_t end) {
      pair_range(weight, all_rows, rows, first, end, out_ptr, tiles * kTile);
    });
  }
  return out;
}

void share_pairs(int64_t pairs, PairRange* ranges, int threads) {
  for (int t = 0; t < threads; ++t) {
    const auto [begin, end] = share(pairs, t, threads);
    ranges[t].store(static_cast<uint64_t>(end) << 32 | begin);
  }
}

// Symmetric int8 per row and group; the same arithmetic as packing.quantize_activations
// (max |x|, one division each for the step and its inverse, round half to even), a vector of
// values per instruction: one value at a time would cost as much as the products
// themselves on a few rows.
void quantize_groups(const float* x, int64_t group, int64_t begin, int64_t end, const QuantizedView& out) {
  for (int64_t i = begin; i < end; ++i) {
    const GroupQuantized quantized = quantize_group(x + i * group, group, out.q + i * group);
    out.step[i] = quantized.step;
    out.scaled_sum[i] = quantized.step * static_cast<float>(quantized.sum);
    out.sum[i] = quantized.sum;
  }
}

PreparedWeight::PreparedWeight(const Projection& p)
    : format(check_params(p.q, p.scale, p.min, p.scale_step, p.min_step, p.values, p.group, p.bits)),
      q(p.q.data_ptr<uint8_t>()), tile_bytes(p.q.numel() / std::max<int64_t>(1, p.scale.size(0))),
      pairs(p.scale.size(0) / 2), params(p.scale, p.min, p.scale_step, p.min_step, p.values), group(p.group),
      bits(p.bits) {
  TORCH_CHECK(p.scale.size(0) % 2 == 0, "the kernel works on pairs of 16-output tiles (N % 32 == 0)");
}

void pair_range(const PreparedWeight& w, const Activations& act, int64_t rows, int64_t first, int64_t end, float* out,
                int64_t out_stride) {
  for (int64_t pair = first; pair < end; ++pair) {
    pair_products(2 * pair, static_cast<int>(rows), w.q, w.tile_bytes, w.params, w.group, w.bits, w.format, act, out,
                  out_stride);
  }
}

// The float rows of the weight for the given output indices (embedding lookup): [len(ids), K].
at::Tensor rows(at::Tensor ids, at::Tensor q, at::Tensor scale, at::Tensor min, at::Tensor scale_step,
                at::Tensor min_step, at::Tensor values, int64_t group, int64_t bits) {
  const Format format = check_params(q, scale, min, scale_step, min_step, values, group, bits);
  const int64_t tiles = scale.size(0), groups = scale.size(1), k = groups * group, chunks = group / 4;
  const int64_t tile_bytes = q.numel() / tiles;
  const int64_t unit = unit_chunks(static_cast<int>(chunks), static_cast<int>(bits)), per_unit = unit / chunks;
  const int64_t unit_lines = lines_per_group(unit, bits);
  ids = ids.contiguous().to(at::kLong);
  at::Tensor out = at::empty({ids.numel(), k}, at::kFloat);
  const int64_t* id = ids.data_ptr<int64_t>();
  const uint8_t* q_ptr = q.data_ptr<uint8_t>();
  const WeightParams params(scale, min, scale_step, min_step, values);
  // One group's value for one output, as group_values computes it
  const auto value_of = [&](const uint8_t* values, const at::Half* steps, int64_t g, int64_t lane) {
    if (!format.coded) return static_cast<float>(reinterpret_cast<const at::Half*>(values)[g * kTile + lane]);
    return static_cast<float>(reinterpret_cast<const int8_t*>(values)[g * kTile + lane]) *
           static_cast<float>(steps[(g / params.per_step) * kTile + lane]);
  };
  float* out_ptr = out.data_ptr<float>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t tile = id[i] / kTile, lane = id[i] % kTile;
    TORCH_CHECK(id[i] >= 0 && tile < tiles, "token id out of range");
    for (int64_t g = 0; g < groups; ++g) {
      const TileParams p = params.tile(tile);
      const float s = value_of(static_cast<const uint8_t*>(p.scale), p.scale_step, g, lane);
      // symmetric weights: their min is 2^(value bits - 1) * scale, as packing.group_params has it
      const float m = format.symmetric ? static_cast<float>(1 << ((format.mapped ? 8 : bits) - 1)) * s
                                       : value_of(static_cast<const uint8_t*>(p.min), p.min_step, g, lane);
      const uint8_t* unit_lines_at = q_ptr + tile * tile_bytes + g / per_unit * unit_lines * kTile * 4 + lane * 4;
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t u = g % per_unit * chunks + c;  // the chunk's place in its unit
        for (int64_t b = 0; b < 4; ++b) {
          uint8_t value;
          if (bits == 8) {
            value = unit_lines_at[u * kTile * 4 + b];
          } else {
            const int low = low_bits(static_cast<int>(bits)), top = top_bits(static_cast<int>(bits));
            const uint8_t byte = unit_lines_at[(u / (8 / low)) * kTile * 4 + b];
            value = (byte >> (low * (u % (8 / low)))) & ((1 << low) - 1);
            if (top > 0) {  // the chunk's top bits, from the lines after the low bits
              const int64_t per_line = 8 / top;
              const uint8_t tops = unit_lines_at[(unit * low / 8 + u / per_line) * kTile * 4 + b];
              value |= ((tops >> (top * (u % per_line))) & ((1 << top) - 1)) << low;
            }
            if (format.mapped) value = p.values[value];  // the tile's table
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
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat && x.dim() >= 1 && x.size(-1) > 0 &&
                  weight.numel() == x.size(-1),
              "rms_norm: x [..., D] and weight [D], float32");
  x = x.contiguous();
  weight = weight.contiguous();
  const int64_t d = x.size(-1), rows = x.numel() / d;
  at::Tensor out = at::empty_like(x);
  const float* src = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = rms_scale(src + r * d, d, eps);
    for (int64_t i = 0; i < d; ++i) dst[r * d + i] = src[r * d + i] * scale * w[i];
  }
  return out;
}

float rms_scale(const float* row, int64_t d, double eps) {
  // Sixteen running sums, lane i taking every sixteenth square, added up in a fixed order: the
  // compiler makes vectors of them (one sum, each square added to the last, had waited on the
  // adder's latency: about 2 us per row of the default target, twice per layer and thread).
  constexpr int64_t kLanes = 16;
  double lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += static_cast<double>(row[i + j]) * row[i + j];
  }
  for (int64_t j = 0; i < d; ++i, ++j) lanes[j] += static_cast<double>(row[i]) * row[i];
  double sum = 0.0;
  for (int64_t j = 0; j < kLanes; ++j) sum += lanes[j];
  return static_cast<float>(1.0 / std::sqrt(sum / d + eps));
}
