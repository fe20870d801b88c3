// The fresh-graph builder on the CPU (common/graph_build.h): the range check (raising at once), counts, a
// stable counting sort per side and the values, serially in edge order (O(edges + nodes); the sort is
// stable by construction); both analyses go to the cache.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/graph_build.h"

namespace sparsetorch {
namespace {

namespace gb = graph_build;
namespace cs = csr_stats;

template <typename scalar_t, typename idx_t>
void build(const gb::Problem& p, const int64_t* src, const int64_t* dst, std::vector<at::Tensor>& out) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t E = p.edges, T = p.candidates();
  // per_kept: a row's entries other than dropped loops (the mean's divisor)
  std::vector<int64_t> per_t(p.n_dst, 0), per_s(p.n_src, 0), per_kept(p.n_dst, 0);
  std::vector<int64_t> last_loop(p.loop_weights_from_edges() ? p.n_dst : 0, -1);
  std::vector<char> dropped(T, 0);
  for (int64_t e = 0; e < E; ++e) {
    if (p.drop_loops() && src[e] == dst[e]) {
      dropped[e] = 1;
      if (!last_loop.empty()) last_loop[dst[e]] = e;
    } else {
      ++per_kept[dst[e]];
    }
    ++per_t[dst[e]];
    ++per_s[src[e]];
  }
  for (int64_t node = 0; node < p.nodes; ++node) {
    ++per_t[node];
    ++per_s[node];
    ++per_kept[node];
  }
  int64_t* summary = out[7].data_ptr<int64_t>();
  cs::RowStats stats_a, stats_at;
  for (int64_t len : per_t) stats_a.add(len);
  for (int64_t len : per_s) stats_at.add(len);
  stats_a.write(summary + gb::kStatsA);
  stats_at.write(summary + gb::kStatsAT);
  const int64_t entries = stats_a.entries;

  const auto index_options = p.src.options().dtype(p.index_dtype);
  at::Tensor crow = at::empty({p.n_dst + 1}, index_options), crow_t = at::empty({p.n_src + 1}, index_options);
  at::Tensor col = at::empty({entries}, index_options), col_t = at::empty({entries}, index_options);
  at::Tensor perm = at::empty({entries}, index_options);
  at::Tensor values = at::empty({entries}, p.src.options().dtype(p.dtype));
  at::Tensor values_t = at::empty({entries}, p.src.options().dtype(p.dtype));
  idx_t *crow_p = crow.data_ptr<idx_t>(), *crow_t_p = crow_t.data_ptr<idx_t>();
  std::vector<int64_t> next(p.n_dst), next_t(p.n_src);
  int64_t run = 0;
  for (int64_t r = 0; r < p.n_dst; ++r) {
    crow_p[r] = static_cast<idx_t>(run);
    next[r] = run;
    run += per_t[r];
  }
  crow_p[p.n_dst] = static_cast<idx_t>(run);
  run = 0;
  for (int64_t r = 0; r < p.n_src; ++r) {
    crow_t_p[r] = static_cast<idx_t>(run);
    next_t[r] = run;
    run += per_s[r];
  }
  crow_t_p[p.n_src] = static_cast<idx_t>(run);

  // The weight of candidate entry e (an edge, or node e - E's added loop).
  const scalar_t* w = p.weights ? p.weights->data_ptr<scalar_t>() : nullptr;
  auto weight = [&](int64_t e) -> acc_t {
    if (dropped[e]) return acc_t(0);
    if (e < E) return w ? static_cast<acc_t>(w[e]) : acc_t(1);
    const int64_t node = e - E;
    if (!last_loop.empty() && last_loop[node] >= 0) return static_cast<acc_t>(w[last_loop[node]]);
    return static_cast<acc_t>(p.fill);
  };
  auto source = [&](int64_t e) { return e < E ? src[e] : e - E; };
  auto target = [&](int64_t e) { return e < E ? dst[e] : e - E; };

  idx_t *col_p = col.data_ptr<idx_t>(), *col_t_p = col_t.data_ptr<idx_t>(), *perm_p = perm.data_ptr<idx_t>();
  std::vector<int64_t> slot_of(T), edge_of(entries);
  for (int64_t e = 0; e < T; ++e) {  // edge order: stable
    const int64_t slot = next[target(e)]++;
    col_p[slot] = static_cast<idx_t>(source(e));
    slot_of[e] = slot;
    edge_of[slot] = e;
  }
  for (int64_t e = 0; e < T; ++e) {
    const int64_t slot = next_t[source(e)]++;
    col_t_p[slot] = static_cast<idx_t>(target(e));
    perm_p[slot] = static_cast<idx_t>(slot_of[e]);
  }

  scalar_t* v = values.data_ptr<scalar_t>();
  std::vector<acc_t> d(p.norm == gb::kGcn ? p.n_dst : 0);
  for (int64_t r = 0; r < static_cast<int64_t>(d.size()); ++r) {
    acc_t sum = 0;
    for (int64_t i = crow_p[r]; i < crow_p[r + 1]; ++i) sum += weight(edge_of[i]);
    const acc_t scale = std::pow(sum, acc_t(-0.5));
    d[r] = std::isinf(scale) ? acc_t(0) : scale;
  }
  for (int64_t r = 0; r < p.n_dst; ++r) {
    for (int64_t i = crow_p[r]; i < crow_p[r + 1]; ++i) {
      const acc_t x = weight(edge_of[i]);
      if (p.norm == gb::kGcn) {
        v[i] = static_cast<scalar_t>(d[r] * x * d[col_p[i]]);
      } else if (p.norm == gb::kMean) {
        v[i] = static_cast<scalar_t>(x / static_cast<acc_t>(std::max<int64_t>(per_kept[r], 1)));
      } else {
        v[i] = static_cast<scalar_t>(x);
      }
    }
  }
  scalar_t* v_t = values_t.data_ptr<scalar_t>();
  for (int64_t t = 0; t < entries; ++t) v_t[t] = v[perm_p[t]];
  out[0] = crow;
  out[1] = col;
  out[2] = values;
  out[3] = crow_t;
  out[4] = col_t;
  out[5] = values_t;
  out[6] = perm;
}

std::vector<at::Tensor> build_graph_cpu(const at::Tensor& src_in, const at::Tensor& dst_in,
                                        const std::optional<at::Tensor>& weights, int64_t n_src, int64_t n_dst,
                                        int64_t loops, double fill, int64_t norm, at::ScalarType dtype,
                                        c10::string_view what) {
  const gb::Problem p = gb::make_problem(src_in, dst_in, weights, n_src, n_dst, loops, fill, norm, dtype, what);
  const at::Tensor src = p.src.to(at::kLong).contiguous(), dst = p.dst.to(at::kLong).contiguous();
  const int64_t *s = src.data_ptr<int64_t>(), *d = dst.data_ptr<int64_t>();
  for (int64_t e = 0; e < p.edges; ++e) {
    TORCH_CHECK_INDEX(s[e] >= 0 && s[e] < n_src && d[e] >= 0 && d[e] < n_dst, p.what, ": edge ", e, " (source ",
                      s[e], ", target ", d[e], ") is out of range for a graph of ", n_src, " sources and ", n_dst,
                      " targets");
  }
  std::vector<at::Tensor> out(8);
  out[7] = at::zeros({gb::kSummaryLength}, at::TensorOptions().dtype(at::kLong));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "_build_graph_cpu", [&] {
    if (p.index_dtype == at::kInt) {
      build<scalar_t, int32_t>(p, s, d, out);
    } else {
      build<scalar_t, int64_t>(p, s, d, out);
    }
  });
  const at::Tensor summary = out[7];
  store_csr_analysis(out[0], out[1], n_src, summary.narrow(0, gb::kStatsA, csr_stats::kLength));
  store_csr_analysis(out[3], out[4], n_dst, summary.narrow(0, gb::kStatsAT, csr_stats::kLength));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) { m.impl("_build_graph", &build_graph_cpu); }

}  // namespace sparsetorch
