// Causal attention of prompts (or prompt chunks) of one length, back to back in a step, on
// the CPU in bfloat16 (float32: see below), through torch's brgemm (oneDNN's: AMX tiles
// where the CPU has them, AVX512-BF16 dot products elsewhere; both take the same packed
// pairs).
//
// PyTorch's fused CPU kernel (SDPA) splits a 128-token prompt into query blocks of 32 and
// spends most of its time outside its matmuls at that size. Here a task takes one prompt's
// KV head: it packs the prompt's keys and values once for the matmul (pairs of head dims
// side by side for the scores, sixteen keys' pair gathered into a vector; pairs of keys
// for the values, interleaved by a permute), then attends each block of up to 64 query
// rows for every query head of that KV head: it stacks the heads' rows into one matrix,
// scores them in one matmul (float32) against the keys up to the block's last row, takes
// each row's softmax over the keys up to its own position (max subtracted, then exp, in
// float32; two rows at a time, the last vector of each loaded masked), rounds the
// unnormalised probabilities to bfloat16 as the fused kernel does, applies them to the
// values in a second matmul and divides by their float32 sum. Where there are too few
// prompts and KV heads to go round the threads (a long prompt), a prompt's blocks are
// split into runs, each a task packing its keys up to its last row; threads take the next
// task as they finish one, the runs with the most keys first.
//
// Against the kernel before this layout (a task per block, each packing its keys element by
// element, a row's softmax at a time), the same bits; on 2 threads, 9 query heads over 3:
// 16 prompts of 128 1.26 -> 1.01 ms, one of 2,048 14.2 -> 8.6 ms.
//
// A chunk that continues a cached context (a prefix-cache hit, a long prompt's later chunk)
// is the same sum over more keys: its queries are the last of its keys, so query row r of a
// chunk of len after `offset` earlier keys sees keys 0 .. offset + r.
//
// Shapes: q [T, H, D], T = count x len, prompt p's queries at rows p x len .. (p + 1) x
// len - 1; k and v [count x klen, KVH, D], klen >= len, prompt p's keys (its context, then
// its own) at rows p x klen .. (p + 1) x klen - 1 (any strides, the last one 1); out
// [T, H, D] is written in place (any strides, the last one 1). D 64 or 128; H a multiple
// of KVH. Registered as conveyor_native::prefill_attention;
// conveyor_native::has_prefill_attention(dtype) says whether it was built here for dtype
// (bfloat16 for a CPU with AVX512-BF16; native_kernels also checks its answer once, as
// torch's brgemm must take packed bfloat16 on this CPU).
//
// float32 (any CPU with AVX-512 or AVX2): the same tasks and softmax (probabilities kept in
// float32). A task transposes its prompt's keys once for the scores' matmul (sixteen keys'
// value at one head dim gathered into a vector); the values are read where they lie; both
// matmuls are torch's brgemm in float32. In a step of SmolLM2's 16 prompts of 128 on 2
// threads of an Ice Lake Xeon: 3.0-3.1 ms a layer, against 5.0 in PyTorch's SDPA and 0.5
// more to copy its output into place. On AVX2 (eight lanes a vector: its own softmax,
// transpose and output code, the rest shared), 2 threads of a Zen 3 EPYC: 3.8 ms a layer
// against 7.0 in SDPA and 0.3 more to copy (the torch profiler over a whole prompt step).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

// AVX-512 code where torch's vectors are AVX-512's too: ATEN_CPU_CAPABILITY=avx2 narrows
// them to AVX2's on an AVX-512 CPU, and then the AVX2 code is built (the AVX-512 code, mixing
// its own vectors with torch's, did not compile, and the kernels were left off).
#if defined(__AVX512F__) && defined(CPU_CAPABILITY_AVX512)
#define CONVEYOR_PREFILL_AVX512 1
#endif
// The bfloat16 kernel: AVX-512 with AVX512-BF16.
#if defined(CONVEYOR_PREFILL_AVX512) && defined(__AVX512BF16__)
#define CONVEYOR_PREFILL_BF16 1
#endif
// The float32 kernel: on AVX-512 (sixteen lanes a vector) and on AVX2 (eight; the same
// tasks, matmuls and padding to sixteen keys, its own vector code where marked).
#if defined(CONVEYOR_PREFILL_AVX512) || (defined(__AVX2__) && defined(CPU_CAPABILITY_AVX2))
#define CONVEYOR_PREFILL_FLOAT32 1
#endif

namespace {

#if defined(CONVEYOR_PREFILL_FLOAT32)

constexpr int64_t kLanes = 16;  // keys a row of scores is padded to a multiple of

#endif

#if defined(CONVEYOR_PREFILL_AVX512)

// Offsets of sixteen rows `stride` elements apart, for a gather of one element of each.
inline __m512i row_offsets(int64_t stride) {
  return _mm512_mullo_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
      _mm512_set1_epi32(static_cast<int32_t>(stride)));
}

// The lanes of the sixteen keys from j0 on that are among the first len.
inline __mmask16 live_lanes(int64_t len, int64_t j0) {
  const int64_t live = std::clamp<int64_t>(len - j0, 0, kLanes);
  return static_cast<__mmask16>((1u << live) - 1u);
}

#if defined(CONVEYOR_PREFILL_BF16)

// Keys [len, DIM] (rows stride apart) as [DIM/2][padded][pair]: for each pair of head
// dims, every key's two values side by side; keys past len are zero. Sixteen keys' pair p
// are gathered into one vector (their rows stride apart).
template <int64_t DIM>
void pack_keys(const at::BFloat16* k, int64_t stride, int64_t len, int64_t padded,
               uint32_t* out) {
  const __m512i rows = row_offsets(stride);
  for (int64_t j0 = 0; j0 < padded; j0 += kLanes) {
    const __mmask16 mask = live_lanes(len, j0);
    const at::BFloat16* first = k + std::min(j0, len - 1) * stride;
    for (int64_t p = 0; p < DIM / 2; ++p) {
      // scale 2: the indices count bfloat16 elements
      const __m512i pairs =
          _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, rows, first + 2 * p, 2);
      _mm512_storeu_si512(out + p * padded + j0, pairs);
    }
  }
}

// Indices for _mm512_permutex2var_epi16 that interleave 16 values of two vectors from
// `first` on: a's first, b's first, a's second, ... (b's indices are a's plus 32).
constexpr std::array<int16_t, 32> interleaved(int first) {
  std::array<int16_t, 32> idx{};
  for (int i = 0; i < 16; ++i) {
    idx[2 * i] = static_cast<int16_t>(first + i);
    idx[2 * i + 1] = static_cast<int16_t>(32 + first + i);
  }
  return idx;
}

// Values [len, DIM] as [padded/2][DIM][pair]: for each pair of keys, each head dim's two
// values side by side (the low half the even key's); keys past len are zero. Two keys'
// 32 head dims are interleaved by one permute.
template <int64_t DIM>
void pack_values(const at::BFloat16* v, int64_t stride, int64_t len, int64_t padded,
                 uint32_t* out) {
  alignas(64) static constexpr auto kLow = interleaved(0);
  alignas(64) static constexpr auto kHigh = interleaved(16);
  const __m512i low = _mm512_load_si512(kLow.data());
  const __m512i high = _mm512_load_si512(kHigh.data());
  for (int64_t jp = 0; jp < padded / 2; ++jp) {
    const bool has_even = 2 * jp < len, has_odd = 2 * jp + 1 < len;
    for (int64_t d = 0; d < DIM; d += 2 * kLanes) {
      const __m512i even =
          has_even ? _mm512_loadu_si512(v + 2 * jp * stride + d) : _mm512_setzero_si512();
      const __m512i odd =
          has_odd ? _mm512_loadu_si512(v + (2 * jp + 1) * stride + d) : _mm512_setzero_si512();
      _mm512_storeu_si512(out + jp * DIM + d, _mm512_permutex2var_epi16(even, low, odd));
      _mm512_storeu_si512(out + jp * DIM + d + kLanes,
                          _mm512_permutex2var_epi16(even, high, odd));
    }
  }
}

#endif  // CONVEYOR_PREFILL_BF16

// Sixteen float32 values into place (probabilities, outputs): as they are, or rounded to
// bfloat16.
inline void store_floats(float* out, __m512 e) { _mm512_storeu_ps(out, e); }

#if defined(CONVEYOR_PREFILL_BF16)
inline void store_floats(at::BFloat16* out, __m512 e) {
  const __m256bh rounded = _mm512_cvtneps_pbh(e);
  std::memcpy(out, &rounded, sizeof(rounded));
}
#endif

// A row of dim float32 sums times `factor` into out: as they are, or rounded to bfloat16.
template <typename scalar_t>
inline void scale_row(const float* totals, float factor, int64_t dim, scalar_t* out) {
  const __m512 by = _mm512_set1_ps(factor);
  for (int64_t d = 0; d < dim; d += kLanes) {
    store_floats(out + d, _mm512_mul_ps(_mm512_loadu_ps(totals + d), by));
  }
}

// Softmax numerators of rows' n raw scores, exp((s - max) x scale), in probs' type (float32,
// or rounded to bfloat16) into probs (n a multiple of 16; probs may be scores itself) (zero past each row's `visible` keys, its own position); each row's float32
// sum into sums. Two rows at a time, so that one row's reductions overlap the other's
// work; a row's last vector of visible keys is loaded masked (-inf past them).
template <int64_t ROWS, typename prob_t>
inline void softmax_rows(const float* scores, int64_t n, const int64_t* visible, float scale,
                         prob_t* probs, float* sums) {
  using Vec = at::vec::Vectorized<float>;
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t whole[ROWS];
  __mmask16 tail[ROWS];
  Vec top[ROWS];
  for (int64_t r = 0; r < ROWS; ++r) {
    whole[r] = visible[r] / kLanes;
    tail[r] = static_cast<__mmask16>((1u << (visible[r] % kLanes)) - 1u);
    __m512 max_vec = neg_inf;
    const float* row = scores + r * n;
    for (int64_t v = 0; v < whole[r]; ++v) {
      max_vec = _mm512_max_ps(max_vec, _mm512_loadu_ps(row + v * kLanes));
    }
    const __m512 last = _mm512_mask_loadu_ps(neg_inf, tail[r], row + whole[r] * kLanes);
    max_vec = _mm512_max_ps(max_vec, last);
    top[r] = Vec(_mm512_reduce_max_ps(max_vec));
  }
  const Vec factor(scale);
  for (int64_t r = 0; r < ROWS; ++r) {
    const float* row = scores + r * n;
    prob_t* out = probs + r * n;
    Vec sum_vec(0.0f);
    for (int64_t v = 0; v < whole[r]; ++v) {
      const Vec e = ((Vec(_mm512_loadu_ps(row + v * kLanes)) - top[r]) * factor).exp_u20();
      sum_vec = sum_vec + e;
      store_floats(out + v * kLanes, e);
    }
    int64_t done = whole[r] * kLanes;
    if (tail[r] != 0) {
      const Vec loaded(_mm512_mask_loadu_ps(neg_inf, tail[r], row + done));
      const Vec e = ((loaded - top[r]) * factor).exp_u20();
      sum_vec = sum_vec + e;
      store_floats(out + done, e);
      done += kLanes;
    }
    std::memset(static_cast<void*>(out + done), 0, (n - done) * sizeof(prob_t));
    sums[r] = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, sum_vec);
  }
}

#elif defined(CONVEYOR_PREFILL_FLOAT32)

// AVX2: softmax_rows as above for float32 probabilities, eight lanes a vector; a row's last
// vector of visible keys is loaded in part, -inf past them.
template <int64_t ROWS, typename prob_t>
inline void softmax_rows(const float* scores, int64_t n, const int64_t* visible, float scale,
                         prob_t* probs, float* sums) {
  static_assert(std::is_same_v<prob_t, float>, "AVX2: float32 probabilities only");
  using Vec = at::vec::Vectorized<float>;
  constexpr int64_t kWidth = Vec::size();
  const Vec neg_inf(-std::numeric_limits<float>::infinity());
  const auto visible_vector = [&](const float* row, int64_t r, int64_t v) {
    const int64_t live = std::min(kWidth, visible[r] - v * kWidth);
    return live == kWidth ? Vec::loadu(row + v * kWidth)
                          : Vec::set(neg_inf, Vec::loadu(row + v * kWidth, live), live);
  };
  int64_t vectors[ROWS];
  Vec top[ROWS];
  for (int64_t r = 0; r < ROWS; ++r) {
    vectors[r] = (visible[r] + kWidth - 1) / kWidth;
    Vec max_vec = neg_inf;
    for (int64_t v = 0; v < vectors[r]; ++v) {
      max_vec = at::vec::maximum(max_vec, visible_vector(scores + r * n, r, v));
    }
    top[r] = Vec(at::vec::vec_reduce_all<float>(
        [](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, max_vec));
  }
  const Vec factor(scale);
  for (int64_t r = 0; r < ROWS; ++r) {
    float* out = probs + r * n;
    Vec sum_vec(0.0f);
    for (int64_t v = 0; v < vectors[r]; ++v) {
      const Vec e = ((visible_vector(scores + r * n, r, v) - top[r]) * factor).exp_u20();
      sum_vec = sum_vec + e;
      e.store(out + v * kWidth);
    }
    const int64_t done = vectors[r] * kWidth;
    std::memset(static_cast<void*>(out + done), 0, (n - done) * sizeof(float));
    sums[r] = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, sum_vec);
  }
}

// AVX2: scale_row as above, for float32.
inline void scale_row(const float* totals, float factor, int64_t dim, float* out) {
  using Vec = at::vec::Vectorized<float>;
  for (int64_t d = 0; d < dim; d += Vec::size()) {
    (Vec::loadu(totals + d) * Vec(factor)).store(out + d);
  }
}

#endif  // CONVEYOR_PREFILL_AVX512, AVX2

#if defined(CONVEYOR_PREFILL_FLOAT32)

// The softmax of a block's `stacked` rows (the group's heads' `rows` rows each, the first
// at key position pos0) of n scores, two rows at a time.
template <typename prob_t>
inline void softmax_block(const float* scores, int64_t n, int64_t stacked, int64_t rows,
                          int64_t pos0, float scale, prob_t* probs, float* sums) {
  int64_t m = 0;
  for (; m + 2 <= stacked; m += 2) {
    const int64_t visible[2] = {pos0 + m % rows + 1, pos0 + (m + 1) % rows + 1};
    softmax_rows<2>(scores + m * n, n, visible, scale, probs + m * n, sums + m);
  }
  if (m < stacked) {
    const int64_t visible[1] = {pos0 + m % rows + 1};
    softmax_rows<1>(scores + m * n, n, visible, scale, probs + m * n, sums + m);
  }
}

// `len` queries and `klen` keys a prompt (its queries the last `len` of its keys).
struct Layout {
  int64_t count, len, klen, heads, kv_heads;
  int64_t q_token, q_head, k_token, k_head, v_token, v_head, o_token, o_head;
};

// Query rows of a head in a block, and keys a matmul takes at once.
constexpr int64_t kRows = 64;
constexpr int64_t kKeyChunk = 512;
// Tasks a thread should find at least, for a long prompt's blocks to be split into runs.
constexpr int64_t kTasksPerThread = 8;

// Keys (and values) a block's rows see: up to its last row, in whole pairs of vectors.
inline int64_t keys_seen(int64_t last_row) {
  return (last_row + 2 * kLanes - 1) / (2 * kLanes) * (2 * kLanes);
}

// Tasks: each prompt's KV head, its blocks split into `spans` runs of about equal length
// where there are too few prompts and heads to go round the threads (a long prompt), so
// that the threads share it; the threads take tasks as they finish their last, the runs
// nearest the prompts' ends (the most keys) first. Each thread makes its workspace once
// (`make_workspace()`) and calls `run(prompt, kv_head, first_block, end_block, workspace)`,
// then `done()`.
template <typename MakeWorkspace, typename Run, typename Done>
void run_tasks(const Layout& s, MakeWorkspace make_workspace, Run run, Done done) {
  if (s.len == 0) {
    return;
  }
  const int64_t blocks = (s.len + kRows - 1) / kRows;
  const int64_t heads = s.count * s.kv_heads;
  const int64_t threads = at::get_num_threads();
  const int64_t wanted = kTasksPerThread * threads;
  const int64_t spans = std::clamp<int64_t>((wanted + heads - 1) / heads, 1, blocks);
  const int64_t per_span = (blocks + spans - 1) / spans;
  const int64_t tasks = heads * spans;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(threads, tasks), 1, [&](int64_t, int64_t) {
    auto w = make_workspace();
    for (int64_t task = next++; task < tasks; task = next++) {
      const int64_t span = spans - 1 - task / heads, group = task % heads;
      const int64_t first = span * per_span, end = std::min(blocks, first + per_span);
      if (first < end) {
        run(group / s.kv_heads, group % s.kv_heads, first, end, w);
      }
    }
    done();
  });
}

// Rows a block stacks: every query head of a KV head, up to kRows rows each.
inline int64_t stacked_rows(const Layout& s) {
  return s.heads / s.kv_heads * std::min(kRows, s.len);
}

// One prompt's KV head: where its keys and values are, packed `packed` keys long.
struct PackedHead {
  int64_t prompt, kv_head, packed;
};

// A block's query rows (rows from row0 of one prompt) for every query head of one KV head,
// stacked into one matrix [group x rows, dim]: query head g's rows from row g x rows on.
template <typename scalar_t>
void stack_queries(const Layout& s, const scalar_t* q, const PackedHead& head, int64_t row0,
                   int64_t rows, int64_t dim, scalar_t* queries) {
  const int64_t group = s.heads / s.kv_heads;
  const int64_t first_token = head.prompt * s.len;
  for (int64_t g = 0; g < group; ++g) {
    const int64_t q_head = head.kv_head * group + g;
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(queries + (g * rows + r) * dim,
                  q + (first_token + row0 + r) * s.q_token + q_head * s.q_head,
                  dim * sizeof(scalar_t));
    }
  }
}

// The stacked rows' sums of values (totals [group x rows, dim]) divided by their sums of
// probabilities, into their rows and heads of out.
template <typename scalar_t>
void write_rows(const Layout& s, const float* totals, const float* sums,
                const PackedHead& head, int64_t row0, int64_t rows, int64_t dim,
                scalar_t* out) {
  const int64_t group = s.heads / s.kv_heads;
  const int64_t first_token = head.prompt * s.len;
  for (int64_t m = 0; m < group * rows; ++m) {
    const int64_t q_head = head.kv_head * group + m / rows;
    scalar_t* o = out + (first_token + row0 + m % rows) * s.o_token + q_head * s.o_head;
    scale_row(totals + m * dim, 1.0f / sums[m], dim, o);
  }
}

#endif  // CONVEYOR_PREFILL_FLOAT32

#if defined(CONVEYOR_PREFILL_AVX512)

#if defined(CONVEYOR_PREFILL_BF16)

// A thread's buffers, sized for the longest prompt (`longest` keys, `stacked` rows) and
// reused from task to task; never zeroed (every value read is written first).
struct Workspace {
  Workspace(int64_t longest, int64_t stacked, int64_t dim)
      : keys(new uint32_t[dim / 2 * longest]),
        values(new uint32_t[longest / 2 * dim]),
        queries(new uint16_t[stacked * dim]),
        probs(new uint16_t[stacked * longest]),
        scores(new float[stacked * longest]),
        totals(new float[stacked * dim]),
        sums(new float[stacked]) {}
  std::unique_ptr<uint32_t[]> keys, values;
  std::unique_ptr<uint16_t[]> queries, probs;
  std::unique_ptr<float[]> scores, totals, sums;
};

// A block of up to kRows query rows of one prompt, for every query head of one KV head,
// against the keys and values packed in `w` (`head.packed` long): the heads' rows
// stacked into one matrix, their scores (torch's brgemm, AMX where the CPU has it), the
// softmax, and the probabilities applied to the values.
template <int64_t DIM>
void attend_block(const Layout& s, const at::BFloat16* q, at::BFloat16* out,
                  const PackedHead& head, int64_t row0, float scale, Workspace& w) {
  namespace blas = at::native::cpublas;
  const int64_t group = s.heads / s.kv_heads;
  const int64_t rows = std::min(kRows, s.len - row0);
  const int64_t stacked = group * rows;
  const int64_t pos0 = s.klen - s.len + row0;  // the block's first row's key position
  const int64_t n = keys_seen(pos0 + rows);
  auto* queries = reinterpret_cast<at::BFloat16*>(w.queries.get());
  auto* probs = reinterpret_cast<at::BFloat16*>(w.probs.get());
  float* scores = w.scores.get();
  float* totals = w.totals.get();
  float* sums = w.sums.get();
  stack_queries(s, q, head, row0, rows, DIM, queries);
  const auto* key_bits = reinterpret_cast<const at::BFloat16*>(w.keys.get());
  const auto* value_bits = reinterpret_cast<const at::BFloat16*>(w.values.get());
  for (int64_t c = 0; c < n; c += kKeyChunk) {
    const int64_t width = std::min(kKeyChunk, n - c);
    // keys are [DIM/2][packed][2]: chunk c starts 2c elements into each row of pairs
    blas::brgemm(stacked, width, DIM, DIM, head.packed, n, false, queries, key_bits + 2 * c,
                 scores + c, true);
  }
  softmax_block(scores, n, stacked, rows, pos0, scale, probs, sums);
  for (int64_t c = 0; c < n; c += kKeyChunk) {
    const int64_t width = std::min(kKeyChunk, n - c);
    // values are [packed/2][DIM][2]: chunk c starts c/2 rows of pairs in
    blas::brgemm(stacked, DIM, width, n, DIM, DIM, c > 0, probs + c, value_bits + c * DIM,
                 totals, true);
  }
  write_rows(s, totals, sums, head, row0, rows, DIM, out);
}

// Blocks [first, end) of one prompt's KV head: its keys and values up to the last block's
// last row packed once, then each block attended.
template <int64_t DIM>
void attend_blocks(const Layout& s, const at::BFloat16* q, const at::BFloat16* k,
                   const at::BFloat16* v, at::BFloat16* out, int64_t prompt, int64_t kv_head,
                   int64_t first, int64_t end, float scale, Workspace& w) {
  const int64_t last_key = s.klen - s.len + std::min(s.len, end * kRows);
  const PackedHead head{prompt, kv_head, keys_seen(last_key)};
  const int64_t first_key = prompt * s.klen;
  pack_keys<DIM>(k + first_key * s.k_token + kv_head * s.k_head, s.k_token, last_key,
                 head.packed, w.keys.get());
  pack_values<DIM>(v + first_key * s.v_token + kv_head * s.v_head, s.v_token, last_key,
                   head.packed, w.values.get());
  for (int64_t block = first; block < end; ++block) {
    attend_block<DIM>(s, q, out, head, block * kRows, scale, w);
  }
}

template <int64_t DIM>
void attend_all(const Layout& s, const at::BFloat16* q, const at::BFloat16* k,
                const at::BFloat16* v, at::BFloat16* out, float scale) {
  run_tasks(
      s, [&] { return Workspace(keys_seen(s.klen), stacked_rows(s), DIM); },
      [&](int64_t prompt, int64_t kv_head, int64_t first, int64_t end, Workspace& w) {
        attend_blocks<DIM>(s, q, k, v, out, prompt, kv_head, first, end, scale, w);
      },
      [] { at::native::cpublas::brgemm_release(true); });
}

#endif  // CONVEYOR_PREFILL_BF16

// float32: keys [len, dim] (rows stride apart) transposed into [dim][padded] for the
// scores' matmul; keys past len are zero. Sixteen keys' value at one head dim are gathered
// into one vector.
void transpose_keys(const float* k, int64_t stride, int64_t len, int64_t padded, int64_t dim,
                    float* out) {
  const __m512i rows = row_offsets(stride);
  for (int64_t j0 = 0; j0 < padded; j0 += kLanes) {
    const __mmask16 mask = live_lanes(len, j0);
    const float* first = k + std::min(j0, len - 1) * stride;
    for (int64_t d = 0; d < dim; ++d) {
      _mm512_storeu_ps(out + d * padded + j0,
                       _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask, rows, first + d, 4));
    }
  }
}

#elif defined(CONVEYOR_PREFILL_FLOAT32)

// AVX2: transpose_keys as above, eight keys' value at one head dim gathered at a time.
void transpose_keys(const float* k, int64_t stride, int64_t len, int64_t padded, int64_t dim,
                    float* out) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i rows = _mm256_mullo_epi32(lane, _mm256_set1_epi32(static_cast<int32_t>(stride)));
  for (int64_t j0 = 0; j0 < padded; j0 += 8) {
    const int32_t live = static_cast<int32_t>(std::clamp<int64_t>(len - j0, 0, 8));
    const __m256 mask = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(live), lane));
    const float* first = k + std::min(j0, len - 1) * stride;
    for (int64_t d = 0; d < dim; ++d) {
      _mm256_storeu_ps(out + d * padded + j0,
                       _mm256_mask_i32gather_ps(_mm256_setzero_ps(), first + d, rows, mask, 4));
    }
  }
}

#endif  // CONVEYOR_PREFILL_AVX512, AVX2

#if defined(CONVEYOR_PREFILL_FLOAT32)

// float32: a thread's buffers, sized for the longest prompt, reused from task to task.
struct Workspace32 {
  Workspace32(int64_t longest, int64_t stacked, int64_t dim)
      : keys(new float[dim * longest]),
        queries(new float[stacked * dim]),
        scores(new float[stacked * longest]),
        totals(new float[stacked * dim]),
        sums(new float[stacked]) {}
  std::unique_ptr<float[]> keys, queries, scores, totals, sums;
};

// float32: a block of up to kRows query rows of one prompt, for every query head of one KV
// head, against its keys transposed in `w` (`head.packed` wide) and its values where they
// are: the heads' rows stacked into one matrix, their scores (torch's brgemm), the softmax
// (rows of scores `n` long: the keys seen, rounded up to 16), the probabilities applied to
// the values (as many as the last row sees).
void attend_block32(const Layout& s, const float* q, const float* v, float* out,
                    const PackedHead& head, int64_t row0, int64_t dim, float scale,
                    Workspace32& w) {
  namespace blas = at::native::cpublas;
  const int64_t group = s.heads / s.kv_heads;
  const int64_t rows = std::min(kRows, s.len - row0);
  const int64_t stacked = group * rows;
  const int64_t pos0 = s.klen - s.len + row0;  // the block's first row's key position
  const int64_t seen = pos0 + rows;            // keys its last row sees
  const int64_t n = (seen + kLanes - 1) / kLanes * kLanes;
  const float* values = v + head.prompt * s.klen * s.v_token + head.kv_head * s.v_head;
  float* queries = w.queries.get();
  float* scores = w.scores.get();
  float* totals = w.totals.get();
  float* sums = w.sums.get();
  stack_queries(s, q, head, row0, rows, dim, queries);
  for (int64_t c = 0; c < n; c += kKeyChunk) {
    const int64_t width = std::min(kKeyChunk, n - c);
    blas::brgemm(stacked, width, dim, dim, head.packed, n, false, queries, w.keys.get() + c,
                 scores + c, false);
  }
  softmax_block(scores, n, stacked, rows, pos0, scale, scores, sums);
  for (int64_t c = 0; c < seen; c += kKeyChunk) {
    const int64_t width = std::min(kKeyChunk, seen - c);
    blas::brgemm(stacked, dim, width, n, s.v_token, dim, c > 0, scores + c,
                 values + c * s.v_token, totals, false);
  }
  write_rows(s, totals, sums, head, row0, rows, dim, out);
}

void attend_all32(const Layout& s, const float* q, const float* k, const float* v, float* out,
                  int64_t dim, float scale) {
  run_tasks(
      s, [&] { return Workspace32(keys_seen(s.klen), stacked_rows(s), dim); },
      [&](int64_t prompt, int64_t kv_head, int64_t first, int64_t end, Workspace32& w) {
        const int64_t last_key = s.klen - s.len + std::min(s.len, end * kRows);
        const PackedHead head{prompt, kv_head, keys_seen(last_key)};
        transpose_keys(k + prompt * s.klen * s.k_token + kv_head * s.k_head, s.k_token,
                       last_key, head.packed, dim, w.keys.get());
        for (int64_t block = first; block < end; ++block) {
          attend_block32(s, q, v, out, head, block * kRows, dim, scale, w);
        }
      },
      [] { at::native::cpublas::brgemm_release(false); });
}

#endif  // CONVEYOR_PREFILL_FLOAT32

bool has_prefill_attention(at::ScalarType dtype) {
#if defined(CONVEYOR_PREFILL_BF16)
  if (dtype == at::kBFloat16) return true;
#endif
#if defined(CONVEYOR_PREFILL_FLOAT32)
  if (dtype == at::kFloat) return true;
#endif
  return false;
}

void prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       at::Tensor& out, int64_t count, double scale) {
  const at::ScalarType dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kFloat,
              "prefill_attention: bfloat16 or float32 only");
  TORCH_CHECK(has_prefill_attention(dtype), "prefill_attention: not for ", dtype,
              " on this CPU (bfloat16 needs AVX512-BF16, float32 AVX-512 or AVX2)");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && out.dim() == 3,
              "prefill_attention: q, k, v and out must be [tokens, heads, dim]");
  for (const at::Tensor* t : {&q, &k, &v, static_cast<const at::Tensor*>(&out)}) {
    TORCH_CHECK(t->scalar_type() == dtype, "prefill_attention: q, k, v and out in one dtype");
    TORCH_CHECK(t->stride(2) == 1, "prefill_attention: the last dimension must be contiguous");
  }
  const int64_t tokens = q.size(0), dim = q.size(2);
  TORCH_CHECK(dim == 64 || dim == 128, "prefill_attention: head dim 64 or 128, got ", dim);
  TORCH_CHECK(count >= 1 && tokens % count == 0,
              "prefill_attention: tokens must be count prompts of one length");
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(2) == dim,
              "prefill_attention: k and v must be [keys, kv_heads, dim], alike");
  TORCH_CHECK(k.size(0) % count == 0 && k.size(0) / count >= tokens / count,
              "prefill_attention: k and v must hold count contexts, each as long as its "
              "prompt's queries or longer");
  TORCH_CHECK(out.sizes() == q.sizes(), "prefill_attention: out must be shaped as q");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "prefill_attention: heads must be a multiple of kv_heads");
#if defined(CONVEYOR_PREFILL_FLOAT32)
  const Layout s{count,       tokens / count, k.size(0) / count, q.size(1),   k.size(1),
                 q.stride(0), q.stride(1),    k.stride(0),       k.stride(1), v.stride(0),
                 v.stride(1), out.stride(0),  out.stride(1)};
  const auto factor = static_cast<float>(scale);
  if (dtype == at::kFloat) {
    attend_all32(s, q.const_data_ptr<float>(), k.const_data_ptr<float>(),
                 v.const_data_ptr<float>(), out.mutable_data_ptr<float>(), dim, factor);
    return;
  }
#endif
#if defined(CONVEYOR_PREFILL_BF16)
  const auto* qp = q.const_data_ptr<at::BFloat16>();
  const auto* kp = k.const_data_ptr<at::BFloat16>();
  const auto* vp = v.const_data_ptr<at::BFloat16>();
  auto* op = out.mutable_data_ptr<at::BFloat16>();
  if (dim == 64) {
    attend_all<64>(s, qp, kp, vp, op, factor);
  } else {
    attend_all<128>(s, qp, kp, vp, op, factor);
  }
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(conveyor_native, m) {
  m.def("has_prefill_attention(ScalarType dtype) -> bool", &has_prefill_attention);
  m.def("prefill_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) out, int count, float scale) -> ()");
}

TORCH_LIBRARY_IMPL(conveyor_native, CPU, m) {
  m.impl("prefill_attention", &prefill_attention);
}
