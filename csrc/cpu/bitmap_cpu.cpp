// bitmap_linear on the CPU: the reference for the CUDA kernel (and what a CPU BitmapWeight runs).
// One task per strip of 16 rows (at::parallel_for): for each of its groups, each set bit of each
// quadrant's bitmap is one value, at the row and column that common/bitmap_layout.h gives it; the
// value times that column of x (transposed to (k, n) once, so the token loop is contiguous) is added to
// the row's accumulator, in the accumulate type (float for half types). The layout is checked as it is
// read (offsets in range and matching the bitmaps' popcounts, no bit outside the weight): IndexError.
//
// Semantics match the CUDA kernel (and F.linear on the dense weight) where x holds NaN or Inf: the
// tensor cores multiply the weight's zeros too, so output (token, row) is NaN when the token has a
// non-finite feature in a column where the row has no entry (0 * inf), and otherwise what the
// entries' products give (+-inf, NaN). Here: per row and token with non-finite features, a count of
// those features that the row's entries cover; fewer than the token has means one met a zero.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/activation.h"
#include "common/bitmap_checks.h"
#include "common/bitmap_layout.h"

namespace sparsetorch {
namespace {

// The layout's offsets: non-decreasing from 0 to values.size(0), each group's count equal to the
// popcount of its 16 bitmaps.
void check_layout(const int64_t* bitmaps, const int32_t* offsets, int64_t groups, int64_t nvalues) {
  TORCH_CHECK_INDEX(offsets[0] == 0 && offsets[groups] == nvalues, "offsets: expected to run from 0 to ", nvalues,
                    " (the number of values), got ", offsets[0], " .. ", offsets[groups]);
  at::parallel_for(0, groups, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      int64_t bits = 0;
      for (int q = 0; q < kBitmapQuadrants; ++q) {
        bits += __builtin_popcountll(static_cast<uint64_t>(bitmaps[g * kBitmapQuadrants + q]));
      }
      TORCH_CHECK_INDEX(offsets[g + 1] - int64_t{offsets[g]} == bits, "offsets: group ", g, " holds ",
                        offsets[g + 1] - int64_t{offsets[g]}, " values but its bitmaps have ", bits, " bits set");
    }
  });
}

template <typename scalar_t>
void bitmap_linear_kernel(const BitmapProblem& p, const at::Tensor& xt, const int64_t* nonfinite, const int64_t* bitmaps,
                          const int32_t* offsets, const scalar_t* values, const scalar_t* bias, Activation act,
                          double slope, scalar_t* out) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t n = p.n, m = p.m, k = p.k, chunks = p.chunks;
  const acc_t* x = xt.data_ptr<acc_t>();  // (k, n)
  at::parallel_for(0, p.strips, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> acc(kBitmapGroupRows * n);
    std::vector<int64_t> covered(nonfinite != nullptr ? kBitmapGroupRows * n : 0);
    for (int64_t strip = begin; strip < end; ++strip) {
      std::fill(acc.begin(), acc.end(), acc_t(0));
      std::fill(covered.begin(), covered.end(), int64_t{0});
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t g = strip * chunks + c;
        const scalar_t* v = values + offsets[g];
        for (int q = 0; q < kBitmapQuadrants; ++q) {
          uint64_t bits = static_cast<uint64_t>(bitmaps[g * kBitmapQuadrants + q]);
          while (bits != 0) {
            const int b = __builtin_ctzll(bits);
            bits &= bits - 1;
            int row, col;
            bitmap_position(q, b, row, col);
            const int64_t r = strip * kBitmapGroupRows + row, kk = c * kBitmapGroupCols + col;
            TORCH_CHECK_INDEX(r < m && kk < k, "bitmaps: group ", g, " quadrant ", q, " bit ", b,
                              " marks position (", r, ", ", kk, "), outside the ", m, " x ", k, " weight");
            const acc_t w = static_cast<acc_t>(*v++);
            const acc_t* xr = x + kk * n;
            acc_t* ar = acc.data() + row * n;
            for (int64_t t = 0; t < n; ++t) ar[t] += w * xr[t];
            if (nonfinite != nullptr) {
              for (int64_t t = 0; t < n; ++t) covered[row * n + t] += !std::isfinite(xr[t]);
            }
          }
        }
      }
      for (int64_t row = 0; row < kBitmapGroupRows; ++row) {
        const int64_t r = strip * kBitmapGroupRows + row;
        if (r >= m) break;
        const acc_t b = bias != nullptr ? static_cast<acc_t>(bias[r]) : acc_t(0);
        for (int64_t t = 0; t < n; ++t) {
          acc_t z = acc[row * n + t] + b;
          if (nonfinite != nullptr && covered[row * n + t] < nonfinite[t]) z = std::numeric_limits<acc_t>::quiet_NaN();
          out[t * m + r] = static_cast<scalar_t>(apply_activation(act, z, static_cast<acc_t>(slope)));
        }
      }
    }
  });
}

at::Tensor bitmap_linear_cpu(const at::Tensor& x, const at::Tensor& bitmaps, const at::Tensor& offsets,
                             const at::Tensor& values, int64_t out_features, const std::optional<at::Tensor>& bias,
                             c10::string_view activation, double negative_slope, const std::optional<at::Tensor>&,
                             const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                             const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                             const std::optional<at::Tensor>&) {
  const BitmapProblem p = check_bitmap_linear_args(x, bitmaps, offsets, values, out_features, bias);
  const Activation act = parse_activation(std::string(activation));
  at::Tensor out = at::empty({p.n, p.m}, x.options());
  const at::Tensor bm = bitmaps.contiguous(), off = offsets.contiguous(), val = values.contiguous();
  check_layout(bm.data_ptr<int64_t>(), off.data_ptr<int32_t>(), p.strips * p.chunks, val.size(0));
  if (p.n > 0 && p.m > 0) {
    const at::Tensor x2 = x.reshape({p.n, p.k});
    const at::Tensor bias_c = bias.has_value() ? bias->contiguous() : at::Tensor();
    // Non-finite features per token, when there are any.
    const at::Tensor nonfinite = at::isfinite(x2).logical_not().sum(1).contiguous();
    const bool any_nonfinite = p.k > 0 && nonfinite.any().item<bool>();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bitmap_linear_cpu", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const at::Tensor xt = x2.to(c10::CppTypeToScalarType<acc_t>::value).t().contiguous();
      bitmap_linear_kernel<scalar_t>(p, xt, any_nonfinite ? nonfinite.data_ptr<int64_t>() : nullptr,
                                     bm.data_ptr<int64_t>(), off.data_ptr<int32_t>(), val.data_ptr<scalar_t>(),
                                     bias_c.defined() ? bias_c.data_ptr<scalar_t>() : nullptr, act, negative_slope,
                                     out.data_ptr<scalar_t>());
    });
  }
  return out.view(p.out_shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) { m.impl("bitmap_linear", &bitmap_linear_cpu); }

}  // namespace sparsetorch
