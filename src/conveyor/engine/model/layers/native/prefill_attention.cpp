// Causal attention of whole prompts of one length, back to back in a step, on the CPU in
// bfloat16, through torch's brgemm (oneDNN's: AMX tiles where the CPU has them, AVX512-BF16
// dot products elsewhere; both take the same packed pairs).
//
// PyTorch's fused CPU kernel (SDPA) splits a 128-token prompt into query blocks of 32 and
// spends most of its time outside its matmuls at that size. Here a task takes a block of up
// to 64 query rows of one prompt for every query head of one KV head: it packs the keys
// and values up to the block's last row for the matmul (pairs of head dims side by side for
// the scores, pairs of keys for the values), stacks the heads' query rows into one matrix,
// scores them in one matmul (float32), takes each row's softmax over the keys up to its own
// position (max subtracted, then exp, in float32), rounds the unnormalised probabilities
// to bfloat16 as the fused kernel does, applies them to the values in a second matmul and
// divides by their float32 sum.
//
// Shapes: q [T, H, D], k and v [T, KVH, D] (any strides, the last one 1), T = count x len,
// prompt p's tokens at rows p x len .. (p + 1) x len - 1; out [T, H, D] is written in place
// (any strides, the last one 1). D 64 or 128; H a multiple of KVH. Registered as
// conveyor_native::prefill_attention; conveyor_native::has_prefill_attention says whether it
// was built here (for a CPU with AVX512-BF16; native_kernels also checks its answer once,
// as torch's brgemm must take packed bfloat16 on this CPU).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

#if defined(__AVX512BF16__)

constexpr int64_t kLanes = 16;  // float32 lanes of a vector

// Keys [len, DIM] (rows stride apart) as [DIM/2][padded][pair]: for each pair of head
// dims, every key's two values side by side; keys past len are zero.
template <int64_t DIM>
void pack_keys(const at::BFloat16* k, int64_t stride, int64_t len, int64_t padded,
               uint32_t* out) {
  std::array<uint32_t, DIM / 2> row{};
  for (int64_t j = 0; j < padded; ++j) {
    if (j < len) {
      std::memcpy(row.data(), k + j * stride, DIM * sizeof(at::BFloat16));
    } else {
      row.fill(0u);
    }
    for (int64_t p = 0; p < DIM / 2; ++p) {
      out[p * padded + j] = row[p];
    }
  }
}

// Values [len, DIM] as [padded/2][DIM][pair]: for each pair of keys, each head dim's two
// values side by side (the low half the even key's); keys past len are zero.
template <int64_t DIM>
void pack_values(const at::BFloat16* v, int64_t stride, int64_t len, int64_t padded,
                 uint32_t* out) {
  std::array<uint16_t, DIM> even{}, odd{};
  for (int64_t jp = 0; jp < padded / 2; ++jp) {
    for (auto [key, bits] : {std::pair{2 * jp, &even}, std::pair{2 * jp + 1, &odd}}) {
      if (key < len) {
        std::memcpy(bits->data(), v + key * stride, DIM * sizeof(at::BFloat16));
      } else {
        bits->fill(uint16_t{0});
      }
    }
    for (int64_t d = 0; d < DIM; ++d) {
      out[jp * DIM + d] = uint32_t{even[d]} | (uint32_t{odd[d]} << 16);
    }
  }
}

// Softmax numerators of a row's n raw scores, exp((s - max) x scale), rounded to bfloat16
// into probs (zero past `visible`, the row's own position); returns their float32 sum.
inline float softmax_row(float* scores, int64_t n, int64_t visible, float scale,
                         at::BFloat16* probs) {
  using Vec = at::vec::Vectorized<float>;
  const int64_t live = (visible + kLanes - 1) / kLanes * kLanes;
  for (int64_t j = visible; j < live; ++j) {
    scores[j] = -std::numeric_limits<float>::infinity();
  }
  Vec max_vec(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < live; j += kLanes) {
    max_vec = at::vec::maximum(max_vec, Vec::loadu(scores + j));
  }
  const Vec top(at::vec::vec_reduce_all<float>(
      [](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, max_vec));
  const Vec factor(scale);
  Vec sum_vec(0.0f);
  for (int64_t j = 0; j < live; j += kLanes) {
    const Vec e = ((Vec::loadu(scores + j) - top) * factor).exp_u20();
    sum_vec = sum_vec + e;
    const __m256bh rounded = _mm512_cvtneps_pbh(e);
    std::memcpy(probs + j, &rounded, sizeof(rounded));
  }
  std::memset(static_cast<void*>(probs + live), 0, (n - live) * sizeof(at::BFloat16));
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, sum_vec);
}

struct Layout {
  int64_t count, len, heads, kv_heads;
  int64_t q_token, q_head, k_token, k_head, v_token, v_head, o_token, o_head;
};

// Query rows of a head in one task, and keys a matmul takes at once.
constexpr int64_t kRows = 64;
constexpr int64_t kKeyChunk = 512;

// A task's buffers, sized for the longest block (n keys, `stacked` rows) and reused from
// task to task; never zeroed (every value read is written first).
struct Workspace {
  Workspace(int64_t n, int64_t stacked, int64_t dim)
      : keys(new uint32_t[dim / 2 * n]),
        values(new uint32_t[n / 2 * dim]),
        queries(new uint16_t[stacked * dim]),
        probs(new uint16_t[stacked * n]),
        scores(new float[stacked * n]),
        totals(new float[stacked * dim]),
        sums(new float[stacked]) {}
  std::unique_ptr<uint32_t[]> keys, values;
  std::unique_ptr<uint16_t[]> queries, probs;
  std::unique_ptr<float[]> scores, totals, sums;
};

// A block of up to kRows query rows of one prompt, for every query head of one KV head:
// the keys and values up to the block's last row packed for the matmul (torch's brgemm,
// AMX where the CPU has it), the heads' rows stacked into one matrix, their scores, the
// softmax, and the probabilities applied to the values.
template <int64_t DIM>
void attend_block(const Layout& s, const at::BFloat16* q, const at::BFloat16* k,
                  const at::BFloat16* v, at::BFloat16* out, int64_t prompt, int64_t kv_head,
                  int64_t row0, float scale, Workspace& w) {
  namespace blas = at::native::cpublas;
  const int64_t group = s.heads / s.kv_heads;
  const int64_t rows = std::min(kRows, s.len - row0);
  const int64_t stacked = group * rows;
  // Keys the block's last row sees, in whole pairs of vectors (the rest zero).
  const int64_t n = (row0 + rows + 2 * kLanes - 1) / (2 * kLanes) * (2 * kLanes);
  const int64_t first_token = prompt * s.len;
  uint32_t* keys = w.keys.get();
  uint32_t* values = w.values.get();
  auto* queries = reinterpret_cast<at::BFloat16*>(w.queries.get());
  auto* probs = reinterpret_cast<at::BFloat16*>(w.probs.get());
  float* scores = w.scores.get();
  float* totals = w.totals.get();
  float* sums = w.sums.get();
  const int64_t visible = std::min(n, s.len);
  pack_keys<DIM>(k + first_token * s.k_token + kv_head * s.k_head, s.k_token, visible, n, keys);
  pack_values<DIM>(v + first_token * s.v_token + kv_head * s.v_head, s.v_token, visible, n,
                   values);
  for (int64_t g = 0; g < group; ++g) {
    const int64_t head = kv_head * group + g;
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(queries + (g * rows + r) * DIM,
                  q + (first_token + row0 + r) * s.q_token + head * s.q_head,
                  DIM * sizeof(at::BFloat16));
    }
  }
  const auto* key_bits = reinterpret_cast<const at::BFloat16*>(keys);
  const auto* value_bits = reinterpret_cast<const at::BFloat16*>(values);
  for (int64_t c = 0; c < n; c += kKeyChunk) {
    const int64_t width = std::min(kKeyChunk, n - c);
    // keys are [DIM/2][n][2]: chunk c starts 2c elements into each row of pairs
    blas::brgemm(stacked, width, DIM, DIM, n, n, false, queries, key_bits + 2 * c,
                 scores + c, true);
  }
  for (int64_t m = 0; m < stacked; ++m) {
    sums[m] = softmax_row(scores + m * n, n, row0 + m % rows + 1, scale,
                          probs + m * n);
  }
  for (int64_t c = 0; c < n; c += kKeyChunk) {
    const int64_t width = std::min(kKeyChunk, n - c);
    // values are [n/2][DIM][2]: chunk c starts c/2 rows of pairs in
    blas::brgemm(stacked, DIM, width, n, DIM, DIM, c > 0, probs + c,
                 value_bits + c * DIM, totals, true);
  }
  for (int64_t m = 0; m < stacked; ++m) {
    const int64_t head = kv_head * group + m / rows;
    const __m512 inverse = _mm512_set1_ps(1.0f / sums[m]);
    at::BFloat16* o = out + (first_token + row0 + m % rows) * s.o_token + head * s.o_head;
    for (int64_t d = 0; d < DIM; d += kLanes) {
      const __m512 scaled = _mm512_mul_ps(_mm512_loadu_ps(totals + m * DIM + d), inverse);
      const __m256bh rounded = _mm512_cvtneps_pbh(scaled);
      std::memcpy(o + d, &rounded, sizeof(rounded));
    }
  }
}

template <int64_t DIM>
void attend_all(const Layout& s, const at::BFloat16* q, const at::BFloat16* k,
                const at::BFloat16* v, at::BFloat16* out, float scale) {
  const int64_t blocks = (s.len + kRows - 1) / kRows;
  const int64_t longest = (s.len + 2 * kLanes - 1) / (2 * kLanes) * (2 * kLanes);
  const int64_t stacked = s.heads / s.kv_heads * std::min(kRows, s.len);
  at::parallel_for(0, s.count * s.kv_heads * blocks, 1, [&](int64_t begin, int64_t end) {
    Workspace w(longest, stacked, DIM);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t block = task % blocks, group = task / blocks;
      attend_block<DIM>(s, q, k, v, out, group / s.kv_heads, group % s.kv_heads,
                        block * kRows, scale, w);
    }
    at::native::cpublas::brgemm_release(true);
  });
}

#endif  // __AVX512BF16__

bool has_prefill_attention() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

void prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       at::Tensor& out, int64_t count, double scale) {
  TORCH_CHECK(has_prefill_attention(), "prefill_attention: not on this CPU (needs AVX512-BF16)");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && out.dim() == 3,
              "prefill_attention: q, k, v and out must be [tokens, heads, dim]");
  for (const at::Tensor* t : {&q, &k, &v, static_cast<const at::Tensor*>(&out)}) {
    TORCH_CHECK(t->scalar_type() == at::kBFloat16, "prefill_attention: bfloat16 only");
    TORCH_CHECK(t->stride(2) == 1, "prefill_attention: the last dimension must be contiguous");
  }
  const int64_t tokens = q.size(0), dim = q.size(2);
  TORCH_CHECK(dim == 64 || dim == 128, "prefill_attention: head dim 64 or 128, got ", dim);
  TORCH_CHECK(count >= 1 && tokens % count == 0,
              "prefill_attention: tokens must be count prompts of one length");
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == tokens && k.size(2) == dim,
              "prefill_attention: k and v must be [tokens, kv_heads, dim]");
  TORCH_CHECK(out.sizes() == q.sizes(), "prefill_attention: out must be shaped as q");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "prefill_attention: heads must be a multiple of kv_heads");
#if defined(__AVX512BF16__)
  const Layout s{count,       tokens / count, q.size(1),    k.size(1),   q.stride(0),
                 q.stride(1), k.stride(0),    k.stride(1),  v.stride(0), v.stride(1),
                 out.stride(0), out.stride(1)};
  const auto* qp = q.const_data_ptr<at::BFloat16>();
  const auto* kp = k.const_data_ptr<at::BFloat16>();
  const auto* vp = v.const_data_ptr<at::BFloat16>();
  auto* op = out.mutable_data_ptr<at::BFloat16>();
  if (dim == 64) {
    attend_all<64>(s, qp, kp, vp, op, static_cast<float>(scale));
  } else {
    attend_all<128>(s, qp, kp, vp, op, static_cast<float>(scale));
  }
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(conveyor_native, m) {
  m.def("has_prefill_attention() -> bool", &has_prefill_attention);
  m.def("prefill_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) out, int count, float scale) -> ()");
}

TORCH_LIBRARY_IMPL(conveyor_native, CPU, m) {
  m.impl("prefill_attention", &prefill_attention);
}
