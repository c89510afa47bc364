// Fused elementwise ops of a decoder layer, on the CPU, for eager steps: one pass over each
// row, where PyTorch's eager ops write an intermediate tensor per op (five for an RMSNorm,
// two for SiLU-and-multiply, five for the rotation). Each result is rounded to the input's
// dtype where PyTorch's ops round it, so that only float32 summation order differs.
//
// rms_norm(x [.., H], weight [H], eps): weight * (x * rsqrt(mean(x^2) + eps)), computed in
//   float32 and rounded to x's dtype before the weight, as the Llama family does.
// add_rms_norm(residual [.., H], delta [.., H], weight [H], eps) -> (sum, normed): the
//   residual add (rounded, as PyTorch's add is) and rms_norm of the sum, in one pass.
// silu_and_mul(gate_up [.., 2I]) -> [.., I]: silu(gate) * up over the two halves of the
//   last dimension, silu's result rounded before the product, as F.silu returns it.
// rope(x [T, H, D], cos [T, 1, D], sin [T, 1, D]): x * cos + rotate_half(x) * sin, each
//   product and the sum rounded; x is read in place where each head's D values are
//   contiguous (as in a slice of the packed QKV projection).
//
// In bfloat16 and float16, a row (norms) or half a head (rope) of whole vectors is worked
// in registers, loaded and converted where it lies, with no float copy in a buffer: the
// same operations in the same order, so the same bits (2,048 SmolLM2 rows: the rotation
// 0.64 -> 0.32 ms, add-and-norm 0.41 -> 0.30 ms on 2 threads).
//
// Rows are spread over torch's intra-op threads; a few rows (a decode step's) run on the
// calling thread. Registered as conveyor_native::rms_norm, conveyor_native::add_rms_norm,
// conveyor_native::silu_and_mul and conveyor_native::rope.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;

// Rows per task: about 32k elements, so that a decode step's few rows run inline.
inline int64_t grain_rows(int64_t cols) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1));
}

// Round n floats in place to scalar_t's precision (a no-op for float).
template <typename scalar_t>
inline void round_in_place(float* values, scalar_t* scratch, int64_t n) {
  if constexpr (!std::is_same_v<scalar_t, float>) {
    at::vec::convert(values, scratch, n);
    at::vec::convert(scratch, values, n);
  }
}

// a[i] += b[i] over n floats.
inline void add(float* a, const float* b, int64_t n) {
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    (Vec::loadu(a + i) + Vec::loadu(b + i)).store(a + i);
  }
  for (; i < n; ++i) {
    a[i] += b[i];
  }
}

// dst[i] = a[i] * b[i] over n floats.
inline void multiply(const float* a, const float* b, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    (Vec::loadu(a + i) * Vec::loadu(b + i)).store(dst + i);
  }
  for (; i < n; ++i) {
    dst[i] = a[i] * b[i];
  }
}

// Two float vectors rounded to scalar_t and back.
template <typename scalar_t>
inline std::tuple<Vec, Vec> rounded(const Vec& low, const Vec& high) {
  return at::vec::convert_to_float<scalar_t>(at::vec::convert_from_float<scalar_t>(low, high));
}

// A reduced-precision row of n values, n a multiple of Vectorized<scalar_t>'s lanes, is
// normed in registers (two passes over x, no float copy): the same operations in the same
// order as the general rms_norm_row below, so the same bits.
template <typename scalar_t>
void rms_norm_row_lanes(const scalar_t* x, const float* weight, scalar_t* out, int64_t n,
                        float eps) {
  using SVec = at::vec::Vectorized<scalar_t>;
  Vec acc(0.0f);
  for (int64_t i = 0; i < n; i += SVec::size()) {
    auto [low, high] = at::vec::convert_to_float<scalar_t>(SVec::loadu(x + i));
    acc = at::vec::fmadd(low, low, acc);
    acc = at::vec::fmadd(high, high, acc);
  }
  const float sum = at::vec::vec_reduce_all<float>([](Vec& p, Vec& q) { return p + q; }, acc);
  const Vec scale(1.0f / std::sqrt(sum / static_cast<float>(n) + eps));
  for (int64_t i = 0; i < n; i += SVec::size()) {
    auto [low, high] = at::vec::convert_to_float<scalar_t>(SVec::loadu(x + i));
    auto [rlow, rhigh] = rounded<scalar_t>(low * scale, high * scale);
    at::vec::convert_from_float<scalar_t>(Vec::loadu(weight + i) * rlow,
                                          Vec::loadu(weight + i + Vec::size()) * rhigh)
        .store(out + i);
  }
}

// Whether rows of n values of a reduced-precision scalar_t take the in-register paths
// (whole vectors); callers ask only for reduced types.
template <typename scalar_t>
constexpr bool in_lanes(int64_t n) {
  return n % at::vec::Vectorized<scalar_t>::size() == 0;
}

template <typename scalar_t>
void rms_norm_row(const scalar_t* x, const float* weight, scalar_t* out, int64_t n, float eps,
                  float* xf, scalar_t* scratch) {
  if constexpr (at::vec::is_reduced_floating_point_v<scalar_t>) {
    if (in_lanes<scalar_t>(n)) {
      rms_norm_row_lanes<scalar_t>(x, weight, out, n, eps);
      return;
    }
  }
  at::vec::convert(x, xf, n);
  Vec acc(0.0f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    const Vec v = Vec::loadu(xf + i);
    acc = at::vec::fmadd(v, v, acc);
  }
  float sum = at::vec::vec_reduce_all<float>([](Vec& p, Vec& q) { return p + q; }, acc);
  for (; i < n; ++i) {
    sum += xf[i] * xf[i];
  }
  const float scale = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
  const Vec scale_vec(scale);
  for (i = 0; i + Vec::size() <= n; i += Vec::size()) {
    (Vec::loadu(xf + i) * scale_vec).store(xf + i);
  }
  for (; i < n; ++i) {
    xf[i] *= scale;
  }
  round_in_place<scalar_t>(xf, scratch, n);
  multiply(weight, xf, xf, n);
  at::vec::convert(xf, out, n);
}

inline Vec silu(const Vec& g) { return g / (Vec(1.0f) + g.neg().exp()); }

template <typename scalar_t>
inline float silu_and_mul_scalar(float g, float u) {
  return static_cast<float>(static_cast<scalar_t>(g / (1.0f + std::exp(-g)))) * u;
}

template <typename scalar_t>
void silu_and_mul_row(const scalar_t* gate, const scalar_t* up, scalar_t* out, int64_t n) {
  int64_t i = 0;
  if constexpr (std::is_same_v<scalar_t, float>) {
    for (; i + Vec::size() <= n; i += Vec::size()) {
      (silu(Vec::loadu(gate + i)) * Vec::loadu(up + i)).store(out + i);
    }
  } else if constexpr (at::vec::is_reduced_floating_point_v<scalar_t>) {
    using SVec = at::vec::Vectorized<scalar_t>;  // twice Vec's lanes
    for (; i + SVec::size() <= n; i += SVec::size()) {
      auto [g0, g1] = at::vec::convert_to_float<scalar_t>(SVec::loadu(gate + i));
      auto [u0, u1] = at::vec::convert_to_float<scalar_t>(SVec::loadu(up + i));
      // SiLU rounded to scalar_t, as F.silu returns it, then the product.
      auto [s0, s1] = at::vec::convert_to_float<scalar_t>(
          at::vec::convert_from_float<scalar_t>(silu(g0), silu(g1)));
      at::vec::convert_from_float<scalar_t>(s0 * u0, s1 * u1).store(out + i);
    }
  }
  for (; i < n; ++i) {
    out[i] = static_cast<scalar_t>(
        silu_and_mul_scalar<scalar_t>(static_cast<float>(gate[i]), static_cast<float>(up[i])));
  }
}

// A norm's weight fits x's rows and dtype.
void check_norm_weight(const char* op, const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == weight.numel(), op, ": weight has ", weight.numel(),
              " elements for rows of ", x.dim() ? x.size(-1) : 0);
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), op, ": x and weight dtypes differ");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_norm_weight("rms_norm", x, weight);
  const at::Tensor input = x.contiguous();
  const at::Tensor weight_f = weight.to(at::kFloat).contiguous();
  at::Tensor out = at::empty_like(input);
  const int64_t cols = input.size(-1);
  const int64_t num_rows = cols == 0 ? 0 : input.numel() / cols;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, input.scalar_type(), "rms_norm", [&] {
    const scalar_t* src = input.const_data_ptr<scalar_t>();
    const float* w = weight_f.const_data_ptr<float>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, num_rows, grain_rows(cols), [&](int64_t begin, int64_t end) {
      std::vector<float> row(cols);
      std::vector<scalar_t> scratch(cols);
      for (int64_t r = begin; r < end; ++r) {
        rms_norm_row<scalar_t>(src + r * cols, w, dst + r * cols, cols, static_cast<float>(eps),
                               row.data(), scratch.data());
      }
    });
  });
  return out;
}

// sum[i] = a[i] + b[i], rounded to scalar_t (in registers where in_lanes; else through the
// float buffers af and bf).
template <typename scalar_t>
void add_row(const scalar_t* a, const scalar_t* b, scalar_t* sum, int64_t n, float* af,
             float* bf) {
  if constexpr (at::vec::is_reduced_floating_point_v<scalar_t>) {
    if (in_lanes<scalar_t>(n)) {
      using SVec = at::vec::Vectorized<scalar_t>;
      for (int64_t i = 0; i < n; i += SVec::size()) {
        auto [a0, a1] = at::vec::convert_to_float<scalar_t>(SVec::loadu(a + i));
        auto [b0, b1] = at::vec::convert_to_float<scalar_t>(SVec::loadu(b + i));
        at::vec::convert_from_float<scalar_t>(a0 + b0, a1 + b1).store(sum + i);
      }
      return;
    }
  }
  at::vec::convert(a, af, n);
  at::vec::convert(b, bf, n);
  add(af, bf, n);
  at::vec::convert(af, sum, n);
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& residual,
                                                const at::Tensor& delta,
                                                const at::Tensor& weight, double eps) {
  TORCH_CHECK(residual.sizes() == delta.sizes(), "add_rms_norm: residual and delta shapes differ");
  TORCH_CHECK(residual.scalar_type() == delta.scalar_type(),
              "add_rms_norm: residual and delta dtypes differ");
  check_norm_weight("add_rms_norm", residual, weight);
  const at::Tensor a = residual.contiguous(), b = delta.contiguous();
  const at::Tensor weight_f = weight.to(at::kFloat).contiguous();
  at::Tensor sum = at::empty_like(a), out = at::empty_like(a);
  const int64_t cols = a.size(-1);
  const int64_t num_rows = cols == 0 ? 0 : a.numel() / cols;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a.scalar_type(), "add_rms_norm", [&] {
    const scalar_t* ap = a.const_data_ptr<scalar_t>();
    const scalar_t* bp = b.const_data_ptr<scalar_t>();
    const float* w = weight_f.const_data_ptr<float>();
    scalar_t* sp = sum.mutable_data_ptr<scalar_t>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, num_rows, grain_rows(cols), [&](int64_t begin, int64_t end) {
      std::vector<float> row(cols), other(cols);
      std::vector<scalar_t> scratch(cols);
      for (int64_t r = begin; r < end; ++r) {
        add_row<scalar_t>(ap + r * cols, bp + r * cols, sp + r * cols, cols, row.data(),
                          other.data());  // the sum, rounded
        rms_norm_row<scalar_t>(sp + r * cols, w, dst + r * cols, cols, static_cast<float>(eps),
                               row.data(), scratch.data());
      }
    });
  });
  return {sum, out};
}

at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() >= 1, "silu_and_mul: needs at least one dimension");
  const int64_t width = gate_up.size(-1);
  TORCH_CHECK(width % 2 == 0, "silu_and_mul: the last dimension (", width, ") must be even");
  const at::Tensor input = gate_up.contiguous();
  const int64_t half = width / 2;
  auto shape = input.sizes().vec();
  shape.back() = half;
  at::Tensor out = at::empty(shape, input.options());
  const int64_t num_rows = width == 0 ? 0 : input.numel() / width;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, input.scalar_type(), "silu_and_mul",
                                  [&] {
    const scalar_t* src = input.const_data_ptr<scalar_t>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, num_rows, grain_rows(width), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        silu_and_mul_row<scalar_t>(src + r * width, src + r * width + half, dst + r * half, half);
      }
    });
  });
  return out;
}

// a[i] = round(x[i] * c[i]) + round(rotate_half(x)[i] * s[i]) over one head of dim floats
// (rotate_half(x) = (-x2, x1) for the halves x1, x2), each product rounded to scalar_t as
// PyTorch's ops round it, the sum rounded by the caller's store.
template <typename scalar_t>
inline void rotate_head(const float* x, const float* c, const float* s, float* a, float* b,
                        scalar_t* scratch, int64_t dim) {
  const int64_t half = dim / 2;
  multiply(x, c, a, dim);
  round_in_place<scalar_t>(a, scratch, dim);
  int64_t d = 0;
  for (; d + Vec::size() <= half; d += Vec::size()) {
    (Vec::loadu(x + half + d) * Vec::loadu(s + d)).neg().store(b + d);
    (Vec::loadu(x + d) * Vec::loadu(s + half + d)).store(b + half + d);
  }
  for (; d < half; ++d) {
    b[d] = -(x[d + half] * s[d]);
    b[d + half] = x[d] * s[d + half];
  }
  round_in_place<scalar_t>(b, scratch, dim);
  add(a, b, dim);
}

// rotate_head in registers, from x (scalar_t) straight to out, for a reduced-precision head
// whose half is in_lanes: the same operations, so the same bits.
template <typename scalar_t>
inline void rotate_head_lanes(const scalar_t* x, const float* c, const float* s, scalar_t* out,
                              int64_t dim) {
  using SVec = at::vec::Vectorized<scalar_t>;
  constexpr int64_t kVec = Vec::size();
  const int64_t half = dim / 2;
  const float* c2 = c + half;
  const float* s2 = s + half;
  for (int64_t d = 0; d < half; d += SVec::size()) {
    auto [x1l, x1h] = at::vec::convert_to_float<scalar_t>(SVec::loadu(x + d));
    auto [x2l, x2h] = at::vec::convert_to_float<scalar_t>(SVec::loadu(x + half + d));
    auto [a1l, a1h] = rounded<scalar_t>(x1l * Vec::loadu(c + d), x1h * Vec::loadu(c + d + kVec));
    auto [a2l, a2h] =
        rounded<scalar_t>(x2l * Vec::loadu(c2 + d), x2h * Vec::loadu(c2 + d + kVec));
    auto [b1l, b1h] = rounded<scalar_t>((x2l * Vec::loadu(s + d)).neg(),
                                        (x2h * Vec::loadu(s + d + kVec)).neg());
    auto [b2l, b2h] =
        rounded<scalar_t>(x1l * Vec::loadu(s2 + d), x1h * Vec::loadu(s2 + d + kVec));
    at::vec::convert_from_float<scalar_t>(a1l + b1l, a1h + b1h).store(out + d);
    at::vec::convert_from_float<scalar_t>(a2l + b2l, a2h + b2h).store(out + half + d);
  }
}

// One token's heads rotated (x: the token's first head, heads head_stride apart);
// buffers holds 3 * dim floats.
template <typename scalar_t>
void rope_token(const scalar_t* x, int64_t heads, int64_t head_stride, int64_t dim,
                const float* c, const float* s, scalar_t* out, float* buffers, scalar_t* scratch) {
  float* xf = buffers;
  float* a = buffers + dim;
  float* b = buffers + 2 * dim;
  if constexpr (at::vec::is_reduced_floating_point_v<scalar_t>) {
    if (in_lanes<scalar_t>(dim / 2)) {
      for (int64_t h = 0; h < heads; ++h) {
        rotate_head_lanes<scalar_t>(x + h * head_stride, c, s, out + h * dim, dim);
      }
      return;
    }
  }
  for (int64_t h = 0; h < heads; ++h) {
    at::vec::convert(x + h * head_stride, xf, dim);
    rotate_head<scalar_t>(xf, c, s, a, b, scratch, dim);
    at::vec::convert(a, out + h * dim, dim);
  }
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 3 && x.size(-1) % 2 == 0, "rope: x must be [T, heads, even dim]");
  const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2);
  TORCH_CHECK(cos.numel() == tokens * dim && sin.numel() == tokens * dim,
              "rope: cos and sin must hold [T, 1, dim]");
  TORCH_CHECK(x.scalar_type() == cos.scalar_type() && x.scalar_type() == sin.scalar_type(),
              "rope: x, cos and sin dtypes differ");
  // Read in place where each head's dim values are contiguous (a slice of a packed
  // projection is): no copy of the input.
  const at::Tensor input = x.stride(2) == 1 ? x : x.contiguous();
  const int64_t token_stride = input.stride(0), head_stride = input.stride(1);
  const at::Tensor cos_f = cos.to(at::kFloat).contiguous();
  const at::Tensor sin_f = sin.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({tokens, heads, dim}, input.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, input.scalar_type(), "rope", [&] {
    const scalar_t* src = input.const_data_ptr<scalar_t>();
    const float* cp = cos_f.const_data_ptr<float>();
    const float* sp = sin_f.const_data_ptr<float>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, tokens, grain_rows(heads * dim), [&](int64_t begin, int64_t end) {
      std::vector<float> buffers(3 * dim);
      std::vector<scalar_t> scratch(dim);
      for (int64_t t = begin; t < end; ++t) {
        rope_token<scalar_t>(src + t * token_stride, heads, head_stride, dim, cp + t * dim,
                             sp + t * dim, dst + t * heads * dim, buffers.data(), scratch.data());
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(conveyor_native, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor residual, Tensor delta, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("silu_and_mul(Tensor gate_up) -> Tensor");
  m.def("rope(Tensor x, Tensor cos, Tensor sin) -> Tensor");
}

TORCH_LIBRARY_IMPL(conveyor_native, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("rope", &rope);
}
