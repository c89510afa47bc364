// Decode attention over a paged KV cache, read in place, on the CPU.
//
// One query token per row, each row one task, the rows spread over torch's intra-op
// threads. For each KV head, the row's G query heads of that KV head are scored against
// every cached key of the row's blocks (additive mask added, fully hidden positions
// skipped), softmaxed in float32 and applied to the values, reading the keys and values
// where they lie in the cache: no gathered copy of the context is made.
//
// In bfloat16 on a CPU with AVX512-BF16 (blocks of a multiple of 16 slots, head dim 64 or
// 128), keys are scored sixteen at a time by vdpbf16ps, straight from the cache, their
// sums gathered into one vector (score_row_wide with Bfloat16Dots); on other AVX-512 CPUs,
// and in float32 and float16, sixteen at a time by float32 FMAs (FloatDots); on AVX2,
// eight at a time the same way; elsewhere a key at a time in float32. On 2 threads of a
// Zen 3 EPYC (AVX2), SmolLM2's shapes, float32, KV from memory, the call alone took
// 266-318 us a layer at 16 rows and 1,059-1,079 us at 64 with eight keys at a time, against
// 376-420 and 1,593-1,603 us a key at a time.
//
// Shapes: q [T, H, D]; k_cache, v_cache [num_blocks, block_size, KVH, D] (any strides,
// the last one 1); block_tables [T, N] int64; mask [T, N, block_size] additive (0 or
// -inf). Returns [T, H, D] in q's dtype. Registered as conveyor_native::decode_attention.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

// Keys scored a vector's width at a time (score_row_wide) where torch's vectors are
// AVX-512's (sixteen floats) or AVX2's (eight); with AVX512-BF16 as well, bfloat16 keys
// by vdpbf16ps.
#if (defined(__AVX512F__) && defined(CPU_CAPABILITY_AVX512)) || \
    (defined(__AVX2__) && defined(CPU_CAPABILITY_AVX2))
#define CONVEYOR_DECODE_WIDE 1
#endif
#if defined(CONVEYOR_DECODE_WIDE) && defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
#define CONVEYOR_DECODE_BF16 1
#endif

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <typename scalar_t>
inline void load_float(const scalar_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = static_cast<float>(src[i]);
  }
}

template <>
inline void load_float<at::BFloat16>(const at::BFloat16* src, float* dst, int64_t n) {
  using BVec = at::vec::Vectorized<at::BFloat16>;
  int64_t i = 0;
  for (; i + BVec::size() <= n; i += BVec::size()) {
    auto [low, high] = at::vec::convert_to_float<at::BFloat16>(BVec::loadu(src + i));
    low.store(dst + i);
    high.store(dst + i + Vec::size());
  }
  for (; i < n; ++i) {
    dst[i] = static_cast<float>(src[i]);
  }
}

inline float dot(const float* a, const float* b, int64_t n) {
  Vec acc(0.0f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    acc = at::vec::fmadd(Vec::loadu(a + i), Vec::loadu(b + i), acc);
  }
  float sum = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, acc);
  for (; i < n; ++i) {
    sum += a[i] * b[i];
  }
  return sum;
}

inline void add_scaled(float* acc, const float* x, float weight, int64_t n) {
  const Vec w(weight);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    at::vec::fmadd(w, Vec::loadu(x + i), Vec::loadu(acc + i)).store(acc + i);
  }
  for (; i < n; ++i) {
    acc[i] += weight * x[i];
  }
}

// exp(x - max) in place over n scores; returns their sum (hidden positions give 0).
inline float exp_and_sum(float* scores, int64_t n) {
  Vec top_lanes(kNegInf);
  int64_t j = 0;
  for (; j + Vec::size() <= n; j += Vec::size()) {
    top_lanes = at::vec::maximum(top_lanes, Vec::loadu(scores + j));
  }
  float top = at::vec::vec_reduce_all<float>(
      [](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, top_lanes);
  for (; j < n; ++j) {
    top = std::max(top, scores[j]);
  }
  if (top == kNegInf) {
    std::fill(scores, scores + n, 0.0f);
    return 0.0f;
  }
  const Vec shift(top);
  Vec acc(0.0f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    Vec e = (Vec::loadu(scores + i) - shift).exp_u20();
    e.store(scores + i);
    acc = acc + e;
  }
  float sum = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, acc);
  for (; i < n; ++i) {
    scores[i] = std::exp(scores[i] - top);
    sum += scores[i];
  }
  return sum;
}

// One vector of float (Vec::size() lanes: 16 with AVX-512, 8 with AVX2) from as many
// elements at src, widened from 16-bit dtypes.
template <typename scalar_t>
inline Vec load_vec(const scalar_t* src) {
  return Vec::loadu(src);
}

template <>
inline Vec load_vec<at::BFloat16>(const at::BFloat16* src) {
  using BVec = at::vec::Vectorized<at::BFloat16>;
  return std::get<0>(at::vec::convert_to_float<at::BFloat16>(BVec::loadu(src, Vec::size())));
}

template <>
inline Vec load_vec<at::Half>(const at::Half* src) {
  using HVec = at::vec::Vectorized<at::Half>;
  return std::get<0>(at::vec::convert_to_float<at::Half>(HVec::loadu(src, Vec::size())));
}

inline float sum_lanes(const Vec& x) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, x);
}

struct Layout {
  int64_t rows, heads, kv_heads, group, dim, blocks_per_row, block_size, length;
  int64_t q_row, q_head;          // q strides
  int64_t c_block, c_slot, c_head;  // cache strides (k and v alike)
};

template <typename scalar_t>
void attend_task(const Layout& s, int64_t row, int64_t kv_head, const scalar_t* q,
                 const scalar_t* k, const scalar_t* v, const int64_t* tables,
                 const float* mask, float scale, scalar_t* out, std::vector<float>& work) {
  const int64_t G = s.group, D = s.dim, L = s.length;
  float* queries = work.data();        // [G, D]
  float* row_buf = queries + G * D;     // [D]
  float* acc = row_buf + D;             // [G, D]
  float* scores = acc + G * D;          // [G, L]
  for (int64_t g = 0; g < G; ++g) {
    const scalar_t* src = q + row * s.q_row + (kv_head * G + g) * s.q_head;
    load_float(src, queries + g * D, D);
    for (int64_t d = 0; d < D; ++d) queries[g * D + d] *= scale;
  }
  const float* row_mask = mask + row * L;
  const int64_t* row_table = tables + row * s.blocks_per_row;
  for (int64_t pos = 0; pos < L; ++pos) {
    const float bias = row_mask[pos];
    if (bias == kNegInf) {
      for (int64_t g = 0; g < G; ++g) scores[g * L + pos] = kNegInf;
      continue;
    }
    const int64_t block = row_table[pos / s.block_size];
    const int64_t at = block * s.c_block + (pos % s.block_size) * s.c_slot + kv_head * s.c_head;
    load_float(k + at, row_buf, D);
    for (int64_t g = 0; g < G; ++g) scores[g * L + pos] = dot(queries + g * D, row_buf, D) + bias;
  }
  std::vector<float> sums(G);
  for (int64_t g = 0; g < G; ++g) sums[g] = exp_and_sum(scores + g * L, L);
  std::fill(acc, acc + G * D, 0.0f);
  for (int64_t pos = 0; pos < L; ++pos) {
    if (row_mask[pos] == kNegInf) continue;
    const int64_t block = row_table[pos / s.block_size];
    const int64_t at = block * s.c_block + (pos % s.block_size) * s.c_slot + kv_head * s.c_head;
    load_float(v + at, row_buf, D);
    for (int64_t g = 0; g < G; ++g) add_scaled(acc + g * D, row_buf, scores[g * L + pos], D);
  }
  for (int64_t g = 0; g < G; ++g) {
    const float norm = sums[g] > 0.0f ? 1.0f / sums[g] : 0.0f;
    scalar_t* dst = out + (row * s.heads + kv_head * G + g) * D;
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<scalar_t>(acc[g * D + d] * norm);
  }
}

// The same as attend_task for a whole row, where a head is DV whole vectors (dim =
// 16 * DV) and a KV head has at most kMaxGroup query heads. The row's blocks are read in
// order, each block's slots for every KV head while the block is in the core's first-level
// cache, later blocks' keys (then values) prefetched meanwhile (RowPrefetch); each key and
// value is loaded once into vector registers and used by every query head of its group.
constexpr int64_t kMaxGroup = 8;
constexpr int64_t kLine = 64;  // bytes per cache line

// ``locality`` as __builtin_prefetch's: 3 into the first-level cache, 2 into the second.
template <int locality = 3>
inline void prefetch(const void* start, int64_t bytes) {
  const char* at = static_cast<const char*>(start);
  for (int64_t offset = 0; offset < bytes; offset += kLine)
    __builtin_prefetch(at + offset, 0, locality);
}

// Whether block ``b`` of a row is one to prefetch: within the row, its first slot not hidden
// by the mask.
inline bool block_visible(const Layout& s, const float* row_mask, int64_t b) {
  return b < s.blocks_per_row && row_mask[b * s.block_size] != kNegInf;
}

// A row's prefetches while its keys are scored: the keys of the block two ahead of the one
// being scored into the first-level cache (the first two blocks' before the row starts), and
// the scored block's values into the second-level cache for the values pass (so that it
// reads them from there). Blocks whose first slot the mask hides are not fetched; the
// blocks of a row lie anywhere in the cache, so the hardware's own prefetch does not find
// them.
//
// Each block's prefetches are spread over its scoring: ``step`` asks for the next of
// ``slices`` equal slices, once per head scored. Asked all at once at the block's start
// (some two hundred lines: more than a core keeps in flight, the likely reason), they
// helped no more than no software prefetch at all. The call alone, SmolLM2's shapes, 2 threads of a Zen 4 EPYC,
// KV from memory, 64 rows of 128-256 tokens in bfloat16: 0.81-0.91 ms a layer with the burst
// or with none, 0.60-0.77 ms spread; 16 rows 0.20-0.26 against 0.15-0.17 ms; float32 64
// rows 1.23-1.37 against 1.03-1.05 ms.
template <typename scalar_t>
class RowPrefetch {
 public:
  RowPrefetch(const Layout& s, const int64_t* row_table, const float* row_mask,
              const scalar_t* k, const scalar_t* v, int64_t slices)
      : s_(s), table_(row_table), mask_(row_mask), k_(k), v_(v),
        bytes_(s.c_block * static_cast<int64_t>(sizeof(scalar_t))),
        slice_bytes_((bytes_ / slices + kLine - 1) / kLine * kLine) {
    for (int64_t b = 0; b < 2; ++b)
      if (visible(b)) prefetch(k_ + table_[b] * s_.c_block, bytes_);
  }

  // Block b is about to be scored.
  void start_block(int64_t b) {
    keys_ = visible(b + 2) ? reinterpret_cast<const char*>(k_ + table_[b + 2] * s_.c_block) : nullptr;
    values_ = visible(b) ? reinterpret_cast<const char*>(v_ + table_[b] * s_.c_block) : nullptr;
    from_ = 0;
  }

  // The next slice of the block's prefetches.
  void step() {
    const int64_t upto = std::min(bytes_, from_ + slice_bytes_);
    if (from_ < upto) {
      if (keys_ != nullptr) prefetch(keys_ + from_, upto - from_);
      if (values_ != nullptr) prefetch<2>(values_ + from_, upto - from_);
    }
    from_ = upto;
  }

 private:
  bool visible(int64_t at) const { return block_visible(s_, mask_, at); }

  const Layout& s_;
  const int64_t* table_;
  const float* mask_;
  const scalar_t* k_;
  const scalar_t* v_;
  const int64_t bytes_, slice_bytes_;
  const char* keys_ = nullptr;
  const char* values_ = nullptr;
  int64_t from_ = 0;
};

// queries [H, dim] = the row's query heads in float32, scaled.
template <int DV, typename scalar_t>
void load_queries(const Layout& s, int64_t row, const scalar_t* q, float scale, float* queries) {
  for (int64_t h = 0; h < s.heads; ++h) {
    const scalar_t* src = q + row * s.q_row + h * s.q_head;
    for (int i = 0; i < DV; ++i) (load_vec(src + i * Vec::size()) * Vec(scale)).store(queries + (h * DV + i) * Vec::size());
  }
}

// Scores [H, L] of one row (mask added), a key at a time, from ``queries`` (float32,
// scaled already: load_queries): each key is loaded once into vector registers and scored
// against every query head of its group, each score a horizontal sum.
template <int DV, typename scalar_t>
void score_row_vec(const Layout& s, int64_t row, const scalar_t* k, const scalar_t* v,
                   const int64_t* tables, const float* mask, float* scores, const float* queries) {
  const int64_t G = s.group, L = s.length, BS = s.block_size;
  const float* row_mask = mask + row * L;
  const int64_t* row_table = tables + row * s.blocks_per_row;
  RowPrefetch<scalar_t> ahead(s, row_table, row_mask, k, v, s.kv_heads);
  for (int64_t b = 0; b < s.blocks_per_row; ++b) {
    ahead.start_block(b);
    const scalar_t* block = k + row_table[b] * s.c_block;
    for (int64_t kv_head = 0; kv_head < s.kv_heads; ++kv_head) {
      ahead.step();
      Vec qv[kMaxGroup][DV];
      for (int64_t g = 0; g < G; ++g)
        for (int i = 0; i < DV; ++i) qv[g][i] = Vec::loadu(queries + ((kv_head * G + g) * DV + i) * Vec::size());
      for (int64_t slot = 0; slot < BS; ++slot) {
        const int64_t pos = b * BS + slot;
        const float bias = row_mask[pos];
        if (bias == kNegInf) {
          for (int64_t g = 0; g < G; ++g) scores[(kv_head * G + g) * L + pos] = kNegInf;
          continue;
        }
        const scalar_t* key = block + slot * s.c_slot + kv_head * s.c_head;
        Vec keys[DV];
        for (int i = 0; i < DV; ++i) keys[i] = load_vec(key + i * Vec::size());
        for (int64_t g = 0; g < G; ++g) {
          Vec acc = qv[g][0] * keys[0];
          for (int i = 1; i < DV; ++i) acc = at::vec::fmadd(qv[g][i], keys[i], acc);
          scores[(kv_head * G + g) * L + pos] = sum_lanes(acc) + bias;
        }
      }
    }
  }
}

#if defined(CONVEYOR_DECODE_WIDE) && defined(CPU_CAPABILITY_AVX512)
// Sixteen vectors' horizontal sums as one vector (lane j: the sum of x[j]'s lanes), by a
// tree of in-lane unpacks and 128-bit shuffles: 45 instructions for 16 sums.
inline Vec sum_each(const Vec* v) {
  __m512 x[16];
  for (int i = 0; i < 16; ++i) x[i] = v[i];
  __m512 pairs[8];
  for (int i = 0; i < 8; ++i)
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]),
                             _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]));
  __m512 quads[4];  // each 128-bit lane: four vectors' partial sums over that lane
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 low = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88),
                                   _mm512_shuffle_f32x4(quads[0], quads[1], 0xDD));
  const __m512 high = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x88),
                                    _mm512_shuffle_f32x4(quads[2], quads[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, 0x88),
                       _mm512_shuffle_f32x4(low, high, 0xDD));
}
#elif defined(CONVEYOR_DECODE_WIDE)
// Eight vectors' horizontal sums as one vector (lane j: the sum of x[j]'s lanes): two rounds
// of pairwise adds within 128-bit halves, then the halves' sums added across.
inline Vec sum_each(const Vec* x) {
  const __m256 low4 = _mm256_hadd_ps(_mm256_hadd_ps(x[0], x[1]), _mm256_hadd_ps(x[2], x[3]));
  const __m256 high4 = _mm256_hadd_ps(_mm256_hadd_ps(x[4], x[5]), _mm256_hadd_ps(x[6], x[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(low4, high4, 0x20),
                       _mm256_permute2f128_ps(low4, high4, 0x31));
}
#endif

#if defined(CONVEYOR_DECODE_WIDE)
// Scores [H, L] of one row a vector's width of keys at a time (W = Vec::size(): sixteen
// with AVX-512, eight with AVX2; block_size a multiple of W): ``dots(head, keys, stride,
// out)`` fills out[j] with lanes that sum to query head ``head``'s product with key j (at
// keys + j * stride); sum_each gathers the W sums into one vector, which is scaled by
// ``scale``, masked and stored, in place of score_row_vec's horizontal sum a score. Groups
// of W slots that the mask hides whole are not read.
template <typename scalar_t, typename Dots>
void score_row_wide(const Layout& s, int64_t row, const scalar_t* k, const scalar_t* v,
                    const int64_t* tables, const float* mask, float scale, float* scores,
                    Dots dots) {
  constexpr int64_t W = Vec::size();
  const int64_t G = s.group, L = s.length, BS = s.block_size;
  const float* row_mask = mask + row * L;
  const int64_t* row_table = tables + row * s.blocks_per_row;
  const Vec scale_v(scale), hidden(kNegInf);
  RowPrefetch<scalar_t> ahead(s, row_table, row_mask, k, v, BS / W * s.heads);
  for (int64_t b = 0; b < s.blocks_per_row; ++b) {
    ahead.start_block(b);
    const scalar_t* block = k + row_table[b] * s.c_block;
    for (int64_t first = 0; first < BS; first += W) {
      const int64_t pos = b * BS + first;
      const Vec bias = Vec::loadu(row_mask + pos);
      const Vec is_hidden = bias == hidden;
      const bool all_hidden =
          std::all_of(row_mask + pos, row_mask + pos + W, [](float x) { return x == kNegInf; });
      for (int64_t kv_head = 0; kv_head < s.kv_heads; ++kv_head) {
        const scalar_t* keys = block + first * s.c_slot + kv_head * s.c_head;
        for (int64_t head = kv_head * G; head < (kv_head + 1) * G; ++head) {
          ahead.step();
          float* out = scores + head * L + pos;
          if (all_hidden) {
            hidden.store(out);
            continue;
          }
          Vec sums[W];
          dots(head, keys, s.c_slot, sums);
          const Vec scored = at::vec::fmadd(sum_each(sums), scale_v, bias);
          Vec::blendv(scored, hidden, is_hidden).store(out);
        }
      }
    }
  }
}

// Dots for score_row_wide in float32 FMAs, from ``queries`` [H, dim] (float32, scaled
// already: load_queries); keys of 16-bit dtypes are widened to float32 on load.
template <int DV, typename scalar_t>
struct FloatDots {
  const float* queries;
  void operator()(int64_t head, const scalar_t* keys, int64_t stride, Vec* out) const {
    Vec qv[DV];
    for (int i = 0; i < DV; ++i) qv[i] = Vec::loadu(queries + (head * DV + i) * Vec::size());
    for (int j = 0; j < Vec::size(); ++j) {
      const scalar_t* key = keys + j * stride;
      Vec acc = qv[0] * load_vec(key);
      for (int i = 1; i < DV; ++i) acc = at::vec::fmadd(qv[i], load_vec(key + i * Vec::size()), acc);
      out[j] = acc;
    }
  }
};
#endif

#if defined(CONVEYOR_DECODE_BF16)
// Dots for score_row_wide in bfloat16 with AVX512-BF16 (dim of DP * 32): products of
// bfloat16 pairs summed in float32 by vdpbf16ps straight from the query and the cache (no
// conversion; the scale comes after).
template <int DP>
struct Bfloat16Dots {
  const Layout& s;
  const at::BFloat16* q;  // the row's query heads
  void operator()(int64_t head, const at::BFloat16* keys, int64_t stride, Vec* out) const {
    __m512bh qv[DP];
    for (int p = 0; p < DP; ++p) qv[p] = (__m512bh)_mm512_loadu_si512(q + head * s.q_head + 32 * p);
    for (int j = 0; j < 16; ++j) {
      const at::BFloat16* key = keys + j * stride;
      __m512 acc = _mm512_setzero_ps();
      for (int p = 0; p < DP; ++p)
        acc = _mm512_dpbf16_ps(acc, qv[p], (__m512bh)_mm512_loadu_si512(key + 32 * p));
      out[j] = acc;
    }
  }
};
#endif

// Scores [H, L] of one row: a vector's width of keys at a time where blocks are of a
// multiple of it (by vdpbf16ps in bfloat16 with AVX512-BF16 and dim 64 or 128, else by
// float32 FMAs, on AVX-512 and AVX2), else a key at a time (score_row_vec). ``queries`` is
// work space for the row's query heads in float32.
template <int DV, typename scalar_t>
void score_row(const Layout& s, int64_t row, const scalar_t* q, const scalar_t* k,
               const scalar_t* v, const int64_t* tables, const float* mask, float scale,
               float* scores, float* queries) {
#if defined(CONVEYOR_DECODE_BF16)
  if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    if (s.block_size % 16 == 0 && (DV == 4 || DV == 8)) {
      const at::BFloat16* row_q = q + row * s.q_row;
      if (DV == 4)
        return score_row_wide(s, row, k, v, tables, mask, scale, scores, Bfloat16Dots<2>{s, row_q});
      return score_row_wide(s, row, k, v, tables, mask, scale, scores, Bfloat16Dots<4>{s, row_q});
    }
  }
#endif
  load_queries<DV, scalar_t>(s, row, q, scale, queries);
#if defined(CONVEYOR_DECODE_WIDE)
  if (s.block_size % Vec::size() == 0)
    return score_row_wide(s, row, k, v, tables, mask, 1.0f, scores,
                          FloatDots<DV, scalar_t>{queries});
#endif
  score_row_vec<DV, scalar_t>(s, row, k, v, tables, mask, scores, queries);
}

// Vector registers: 32 with AVX-512, 16 with AVX2.
constexpr int kVectorRegisters = Vec::size() == 16 ? 32 : 16;

// How many of a head's DV vectors the values pass sums at once for a group of G query
// heads: as many as fit in the vector registers with the sums of the G heads, the values
// they are summing and a weight.
constexpr int chunk_vectors(int DV, int G) {
  int C = DV;
  while (C > 1 && (G + 1) * C + 1 > kVectorRegisters) C /= 2;
  return C;
}

// acc [H, dim] = the row's values weighted by probs [H, L] (unnormalised), a value at a
// time, block by block: for each KV head and each chunk of C of its DV vectors, the G query
// heads' sums stay in vector registers over the block's slots (G and C known at compile
// time: with G read at run time they lived on the stack, a load and a store around every
// FMA), each value loaded once and used by every query head of its group. Each sum adds
// its terms in the order of the positions, whatever the chunks.
template <int DV, int G, typename scalar_t>
void values_row_group(const Layout& s, int64_t row, const scalar_t* v, const int64_t* tables,
                      const float* mask, const float* scores, float* acc) {
  constexpr int C = chunk_vectors(DV, G);
  static_assert(DV % C == 0, "a head's vectors split into whole chunks");
  const int64_t L = s.length, BS = s.block_size;
  const float* row_mask = mask + row * L;
  const int64_t* row_table = tables + row * s.blocks_per_row;
  const int64_t block_bytes = s.c_block * static_cast<int64_t>(sizeof(scalar_t));
  std::fill(acc, acc + s.heads * DV * Vec::size(), 0.0f);
  if (block_visible(s, row_mask, 0)) prefetch(v + row_table[0] * s.c_block, block_bytes);
  for (int64_t b = 0; b < s.blocks_per_row; ++b) {
    if (block_visible(s, row_mask, b + 1)) prefetch(v + row_table[b + 1] * s.c_block, block_bytes);
    const scalar_t* block = v + row_table[b] * s.c_block;
    for (int64_t kv_head = 0; kv_head < s.kv_heads; ++kv_head) {
      const float* head_scores = scores + kv_head * G * L + b * BS;
      float* head_acc = acc + kv_head * G * DV * Vec::size();
      for (int first = 0; first < DV; first += C) {
        Vec av[G][C];
        for (int g = 0; g < G; ++g)
          for (int i = 0; i < C; ++i)
            av[g][i] = Vec::loadu(head_acc + (g * DV + first + i) * Vec::size());
        for (int64_t slot = 0; slot < BS; ++slot) {
          if (row_mask[b * BS + slot] == kNegInf) continue;
          const scalar_t* value =
              block + slot * s.c_slot + kv_head * s.c_head + first * Vec::size();
          Vec values[C];
          for (int i = 0; i < C; ++i) values[i] = load_vec(value + i * Vec::size());
          for (int g = 0; g < G; ++g) {
            const Vec weight(head_scores[g * L + slot]);
            for (int i = 0; i < C; ++i) av[g][i] = at::vec::fmadd(weight, values[i], av[g][i]);
          }
        }
        for (int g = 0; g < G; ++g)
          for (int i = 0; i < C; ++i) av[g][i].store(head_acc + (g * DV + first + i) * Vec::size());
      }
    }
  }
}

// values_row_group for the row's group size (1 to kMaxGroup).
template <int DV, typename scalar_t>
void values_row(const Layout& s, int64_t row, const scalar_t* v, const int64_t* tables,
                const float* mask, const float* scores, float* acc) {
  static_assert(kMaxGroup == 8, "one case per group size");
  switch (s.group) {
    case 1: return values_row_group<DV, 1>(s, row, v, tables, mask, scores, acc);
    case 2: return values_row_group<DV, 2>(s, row, v, tables, mask, scores, acc);
    case 3: return values_row_group<DV, 3>(s, row, v, tables, mask, scores, acc);
    case 4: return values_row_group<DV, 4>(s, row, v, tables, mask, scores, acc);
    case 5: return values_row_group<DV, 5>(s, row, v, tables, mask, scores, acc);
    case 6: return values_row_group<DV, 6>(s, row, v, tables, mask, scores, acc);
    case 7: return values_row_group<DV, 7>(s, row, v, tables, mask, scores, acc);
    default: return values_row_group<DV, 8>(s, row, v, tables, mask, scores, acc);
  }
}

template <int DV, typename scalar_t>
void attend_row_vec(const Layout& s, int64_t row, const scalar_t* q, const scalar_t* k,
                    const scalar_t* v, const int64_t* tables, const float* mask, float scale,
                    scalar_t* out, std::vector<float>& work) {
  const int64_t L = s.length, H = s.heads;
  float* scores = work.data();         // [H, L]
  float* queries = scores + H * L;     // [H, dim], scaled
  score_row<DV, scalar_t>(s, row, q, k, v, tables, mask, scale, scores, queries);
  float sums[kMaxGroup * 64];
  for (int64_t h = 0; h < H; ++h) sums[h] = exp_and_sum(scores + h * L, L);
  float* acc = queries;  // [H, dim]: the queries are no longer needed
  values_row<DV, scalar_t>(s, row, v, tables, mask, scores, acc);
  for (int64_t h = 0; h < H; ++h) {
    const Vec norm(sums[h] > 0.0f ? 1.0f / sums[h] : 0.0f);
    float* head = acc + h * s.dim;
    for (int i = 0; i < DV; ++i) (Vec::loadu(head + i * Vec::size()) * norm).store(head + i * Vec::size());
    at::vec::convert(head, out + (row * H + h) * s.dim, s.dim);
  }
}

// Rows begin..end: whole rows at once where attend_row_vec fits the head shape, else one
// (row, KV head) pair at a time.
template <typename scalar_t>
void attend_rows(const Layout& s, int64_t begin, int64_t end, const scalar_t* q, const scalar_t* k,
                 const scalar_t* v, const int64_t* tables, const float* mask, float scale,
                 scalar_t* out) {
  const int64_t vectors = s.dim % Vec::size() == 0 ? s.dim / Vec::size() : 0;
  const bool fits = s.group <= kMaxGroup && s.heads <= kMaxGroup * 64 &&
                    (vectors == 2 || vectors == 4 || vectors == 8);
  std::vector<float> work(fits ? s.heads * (s.length + s.dim)
                               : s.group * s.dim * 2 + s.dim + s.group * s.length);
  for (int64_t row = begin; row < end; ++row) {
    if (fits && vectors == 4) {
      attend_row_vec<4, scalar_t>(s, row, q, k, v, tables, mask, scale, out, work);
    } else if (fits && vectors == 8) {
      attend_row_vec<8, scalar_t>(s, row, q, k, v, tables, mask, scale, out, work);
    } else if (fits && vectors == 2) {
      attend_row_vec<2, scalar_t>(s, row, q, k, v, tables, mask, scale, out, work);
    } else {
      for (int64_t kv_head = 0; kv_head < s.kv_heads; ++kv_head)
        attend_task<scalar_t>(s, row, kv_head, q, k, v, tables, mask, scale, out, work);
    }
  }
}

at::Tensor decode_attention(const at::Tensor& q_in, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables_in,
                            const at::Tensor& mask_in, double scale) {
  TORCH_CHECK(q_in.dim() == 3, "q must be [rows, heads, dim]");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.dim() == 4, "caches must be [blocks, slots, kv_heads, dim]");
  TORCH_CHECK(k_cache.strides() == v_cache.strides() && k_cache.sizes() == v_cache.sizes(),
              "k and v caches must share shape and strides");
  TORCH_CHECK(k_cache.stride(3) == 1, "the caches' last dimension must be contiguous");
  TORCH_CHECK(q_in.scalar_type() == k_cache.scalar_type() && k_cache.scalar_type() == v_cache.scalar_type(),
              "q, k and v must share a dtype");
  const at::Tensor q = q_in.stride(2) == 1 ? q_in : q_in.contiguous();
  const at::Tensor tables = block_tables_in.to(at::kLong).contiguous();
  const at::Tensor mask = mask_in.to(at::kFloat).contiguous();
  Layout s{};
  s.rows = q.size(0);
  s.heads = q.size(1);
  s.dim = q.size(2);
  s.kv_heads = k_cache.size(2);
  TORCH_CHECK(s.heads % s.kv_heads == 0, "heads must be a multiple of kv_heads");
  TORCH_CHECK(k_cache.size(3) == s.dim, "q and the caches must share head_dim");
  s.group = s.heads / s.kv_heads;
  s.block_size = k_cache.size(1);
  s.blocks_per_row = tables.size(1);
  s.length = s.blocks_per_row * s.block_size;
  TORCH_CHECK(tables.size(0) == s.rows, "one block table per row");
  TORCH_CHECK(mask.numel() == s.rows * s.length, "mask must be [rows, blocks, block_size]");
  s.q_row = q.stride(0);
  s.q_head = q.stride(1);
  s.c_block = k_cache.stride(0);
  s.c_slot = k_cache.stride(1);
  s.c_head = k_cache.stride(2);
  at::Tensor out = at::empty({s.rows, s.heads, s.dim}, q.options());
  const int64_t tasks = s.rows;
  const int64_t per_task = s.heads * s.length * s.dim;
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(per_task, 1));
  const float fscale = static_cast<float>(scale);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "decode_attention", [&] {
    const scalar_t* qp = q.const_data_ptr<scalar_t>();
    const scalar_t* kp = k_cache.const_data_ptr<scalar_t>();
    const scalar_t* vp = v_cache.const_data_ptr<scalar_t>();
    const int64_t* tp = tables.const_data_ptr<int64_t>();
    const float* mp = mask.const_data_ptr<float>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
      attend_rows<scalar_t>(s, begin, end, qp, kp, vp, tp, mp, fscale, op);
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(conveyor_native, m) {
  m.def("decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(conveyor_native, CPU, m) {
  m.impl("decode_attention", &decode_attention);
}
