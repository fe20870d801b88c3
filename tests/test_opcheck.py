"""torch.library.opcheck on every op: schema, fake (meta) kernels, dispatch under AOT tracing."""
import torch

import sparsetorch  # noqa: F401
from _helpers import random_csr

ops = torch.ops.sparsetorch


def csr_parts(rng, device, m=9, k=7, dtype=torch.float32, batch=None):
    import sparsetorch as st

    if batch is None:
        a = st.from_scipy(random_csr(rng, m, k, 0.4), device=device, dtype=dtype)
    else:
        a = st.from_list([random_csr(rng, m, k, d) for d in (0.1, 0.5, 0.9)[:batch]], device=device, dtype=dtype)
    return a.crow_indices, a.col_indices, a.values


def samples(rng, device):
    crow, col, values = csr_parts(rng, device)
    bcrow, bcol, bvalues = csr_parts(rng, device, batch=3)
    dense = torch.randn(7, 5, device=device)
    x = torch.randn(4, 5, device=device)
    yield ops.spmm, (crow, col, values, dense), {}
    yield ops.spmm, (crow, col, values, dense), dict(alpha=0.5, accumulate=torch.randn(9, 5, device=device),
                                                     beta=2.0, bias=torch.randn(5, device=device), activation="gelu")
    yield ops.spmm, (bcrow, bcol, bvalues, torch.randn(3, 7, 5, device=device)), {}
    yield ops.spmm, (bcrow, bcol, bvalues, dense), dict(activation="relu")
    yield ops.spmm, (crow, col, values, torch.randn(2, 7, 5, device=device)), {}
    yield ops.spmm_out, (crow, col, values, dense, torch.randn(9, 5, device=device)), dict(beta=1.0)
    yield ops.binary, (x, torch.randn(4, 5, device=device), "add"), dict(alpha=2.0)
    yield ops.binary, (x, torch.randn(4, 5, device=device), "div"), {}
    yield ops.binary_scalar, (x, 3.0, "rsub"), {}
    yield ops.activation, (x, "silu"), {}
    yield ops.bias_act, (x, torch.randn(5, device=device), torch.randn(5, device=device), "tanh"), {}
    yield ops.bias_act, (x, None, None), {}
    yield ops.csr_scale, (crow, col, values, torch.rand(9, device=device), torch.rand(7, device=device)), {}
    yield ops.csr_scale, (bcrow, bcol, bvalues, torch.rand(3, 9, device=device), None), {}
    edge_src, edge_dst = torch.tensor([0, 2, 1, 3, 3], device=device), torch.tensor([1, 2, 0, 3, 1], device=device)
    yield ops._build_graph, (edge_src, edge_dst, None, 4, 4, 1, 1.0, 1, torch.float32, "edge_index"), {}
    yield ops._build_graph, (edge_src.int(), edge_dst.int(), torch.rand(5, device=device), 4, 5, 0, 1.0, 2,
                             torch.float32, "edge_index"), {}
    yield ops.csr_stats, (crow, col, 7), {}
    yield ops.csr_analysis, (crow, col, 7), {}
    yield ops.csr_validate, (crow, col, 7), dict(force=True)
    xg = torch.randn(4, 5, device=device, dtype=torch.float64, requires_grad=True)
    sg = torch.randn(5, device=device, dtype=torch.float64, requires_grad=True)
    bg = torch.randn(5, device=device, dtype=torch.float64, requires_grad=True)
    yield ops.bias_act, (xg, sg, bg, "gelu"), {}
    yield ops.activation, (xg, "sigmoid"), {}
    yield ops.bias_act_backward, (torch.randn(4, 5, device=device), x, torch.randn(5, device=device),
                                  torch.randn(5, device=device), "silu", 0.01, [True, True, True]), {}
    yield ops.bias_act_backward, (torch.randn(4, 5, device=device), x, None, None, "relu", 0.01,
                                  [True, False, False]), {}
    yield ops.linear, (torch.randn(2, 3, 8, device=device), torch.randn(6, 8, device=device),
                       torch.randn(6, device=device)), dict(activation="relu")
    yield ops.linear, (torch.randn(3, 8, device=device), torch.randn(6, 8, device=device)), dict(activation="silu")
    yield ops.dense_bmm, (torch.randn(3, 4, 5, device=device), torch.randn(5, 2, device=device)), {}
    yield ops.dense_bmm, (torch.randn(4, 5, device=device), torch.randn(3, 5, 2, device=device)), {}
    yield ops.sddmm, (crow, col, torch.randn(9, 5, device=device), torch.randn(7, 5, device=device)), dict(alpha=2.0)
    yield ops.sddmm, (bcrow, bcol, torch.randn(3, 9, 5, device=device), torch.randn(7, 5, device=device)), {}
    yield ops.sddmm, (crow, col, torch.randn(2, 9, 5, device=device), torch.randn(2, 7, 5, device=device)), {}

    # With inputs that require grad, opcheck also traces each op's backward (register_autograd).
    def g(*shape):
        return torch.randn(*shape, device=device, dtype=torch.float64, requires_grad=True)

    dcrow, dcol, dvalues = csr_parts(rng, device, dtype=torch.float64)
    dvalues = dvalues.clone().requires_grad_()
    bdcrow, bdcol, bdvalues = csr_parts(rng, device, dtype=torch.float64, batch=3)
    bdvalues = bdvalues.clone().requires_grad_()
    yield ops.spmm, (dcrow, dcol, dvalues, g(7, 5)), dict(alpha=0.5, accumulate=g(9, 5), beta=2.0, bias=g(5),
                                                          activation="silu")
    yield ops.spmm, (bdcrow, bdcol, bdvalues, g(7, 5)), {}
    yield ops.sddmm, (dcrow, dcol, g(9, 5), g(7, 5)), dict(alpha=1.5)
    yield ops.sddmm, (bdcrow, bdcol, g(3, 9, 5), g(3, 7, 5)), {}
    yield ops.binary, (g(4, 5), g(4, 5), "mul"), {}
    yield ops.binary_scalar, (g(4, 5), 2.0, "div"), {}
    yield ops.linear, (g(3, 8), g(6, 8), g(6)), dict(activation="gelu")
    yield ops.dense_bmm, (g(3, 4, 5), g(5, 2)), {}
    import sparsetorch as st
    from sparsetorch.pruned.blocked import BlockedLayout

    layout = BlockedLayout(st.CSR(crow, col, values, (9, 7)))
    fvalues = values.clone().requires_grad_()
    yield ops.spmm_blocked, (crow, col, fvalues, layout.run_ptr, layout.block_col, layout.pair_values(values),
                             torch.randn(7, 5, device=device, requires_grad=True)), dict(
        alpha=0.5, accumulate=torch.randn(9, 5, device=device, requires_grad=True), beta=2.0,
        bias=torch.randn(5, device=device, requires_grad=True), activation="silu")
    yield ops.csr_scale, (dcrow, dcol, dvalues, torch.rand(9, device=device, dtype=torch.float64,
                                                            requires_grad=True), g(7)), {}
    # bitmap_linear (tests/test_bitmap.py has the rest): bfloat16 on CUDA (tensor cores), float32 on the CPU
    bdtype = torch.bfloat16 if device == "cuda" else torch.float32
    w = torch.randn(20, 70, device=device) * (torch.rand(20, 70, device=device) < 0.4)
    W = st.BitmapWeight.from_dense(w.to(bdtype))
    names = ("t_bitmaps", "t_offsets", "t_index", "csr_crow", "csr_col", "csr_index")
    yield ops.bitmap_linear, (torch.randn(3, 70, device=device, dtype=bdtype, requires_grad=True), W.bitmaps,
                              W.offsets, W.values.detach().clone().requires_grad_(), 20), dict(
        bias=torch.randn(20, device=device, dtype=bdtype, requires_grad=True), activation="relu",
        **dict(zip(names, W.prepare_backward())))
    # csr16_linear (tests/test_csr16.py has the rest): a bfloat16 weight packed from a CSR, no autograd of its own
    from sparsetorch.pruned.csr16 import Csr16Weight

    C = Csr16Weight(crow, col, values.to(torch.bfloat16), (9, 7))
    yield ops.csr16_linear, (torch.randn(3, 7, device=device, dtype=torch.bfloat16), C.crow, C.entries), dict(
        bias=torch.randn(9, device=device, dtype=torch.bfloat16), activation="silu")
    # slot_linear (tests/test_slots.py has the rest): the same weight in the slot layout
    from sparsetorch.pruned.slots import SlotWeight

    for banded in (False, True):
        S = SlotWeight(crow, col, values.to(torch.bfloat16), (9, 7), banded=banded)
        yield ops.slot_linear, (torch.randn(3, 7, device=device, dtype=torch.bfloat16), S.offsets, S.entries, 9), dict(
            bias=torch.randn(9, device=device, dtype=torch.bfloat16), activation="gelu", banded=banded)
        yield ops.slot_to_dense, (S.offsets, S.entries, 9, 7, torch.bfloat16, banded), {}

    # sparse24_decode_linear (tests/test_sparse24_decode.py has the rest): a 2:4 bfloat16 weight, leading batch dims
    from sparsetorch.pruned.sparse24 import prune_2to4_mask
    from sparsetorch.pruned.sparse24_decode import Sparse24DecodeWeight

    w = torch.randn(32, 64, device=device)
    D = Sparse24DecodeWeight((w * prune_2to4_mask(w)).to(torch.bfloat16))
    yield ops.sparse24_decode_linear, (torch.randn(2, 3, 64, device=device, dtype=torch.bfloat16), D.values, D.meta, 32,
                                       64), dict(bias=torch.randn(32, device=device, dtype=torch.bfloat16),
                                                 activation="gelu")
    yield ops.sparse24_decode_to_dense, (D.values, D.meta, 32, 64), {}
    pairs = (w * prune_2to4_mask(w)).to(torch.bfloat16).to_sparse_csr()  # two nonzeros per group of 4 (randn)
    yield ops.sparse24_decode_pack_pairs, (pairs.values().clone(), pairs.col_indices().clone(), 32, 64), {}
    # csr_to_dense: batched values, a gradient
    yield ops.csr_to_dense, (crow, col, values, 9, 7), {}
    yield ops.csr_to_dense, (dcrow, dcol, dvalues, 9, 7), {}
    yield ops.csr_to_dense, (dcrow, dcol, torch.stack([dvalues, -dvalues]).detach().requires_grad_(), 9, 7), {}
    yield ops.csr_to_dense, (bdcrow, bdcol, bdvalues, 9, 7), {}

    # sparse_linear (SparseLinear's op: the layer's forms behind an integer handle; tests/test_sparse_linear.py)
    layer = st.nn.SparseLinear.from_dense(torch.randn(8, 6, device=device), sparsity=0.5)
    xl = torch.randn(3, 6, device=device, requires_grad=True)
    yield ops.sparse_linear, (xl, layer.values, layer._handle), {}
    yield ops.sparse_linear_inference, (xl.detach(), layer._handle), {}
    yield ops.sparse_linear_backward, (torch.randn(3, 8, device=device), xl.detach(), layer.values.detach(),
                                       layer._handle, True, True), {}

# Device- or library-specific ops, checked in their own test files: the 2:4 ops (CUDA with cuSPARSELt only;
# sparse24_linear's opcheck is in tests/test_sparse24.py, the others are not traced: eager-only helpers).
OPCHECKED_ELSEWHERE = {"sparsetorch::sparse24_compress", "sparsetorch::sparse24_check", "sparsetorch::sparse24_linear",
                       "sparsetorch::sparse24_search", "sparsetorch::cusparselt_version"}


def test_opcheck_all_ops(device, rng):
    seen = set()
    for op, args, kwargs in samples(rng, device):
        torch.library.opcheck(op, args, kwargs)
        seen.add(op._qualified_op_name)
    # Every op in the library has at least one sample above, except the routing module's answers (a
    # route name, a list of names, the cache's size, the measuring switch, a measured route), the name
    # of the CPU kernels' build, the statistics' layout, the native caches' reset and sizes, and what the
    # loaded CUDA code can run: they return no tensors and are never traced.
    not_traced = {"sparsetorch::spmm_route", "sparsetorch::spmm_route_candidates", "sparsetorch::csr_analysis_cache",
                  "sparsetorch::set_autotune", "sparsetorch::spmm_tune", "sparsetorch::_cpu_isa",
                  "sparsetorch::_csr_analysis_store", "sparsetorch::csr_stats_layout",
                  "sparsetorch::_clear_native_caches", "sparsetorch::_native_cache_sizes",
                  "sparsetorch::cuda_features", "sparsetorch::spmm_route_unavailable"}
    # ... and the tuning table's (csrc/common/spmm_tuning.h): a signature, plain lists, counters
    not_traced |= {"sparsetorch::spmm_tuning_signature", "sparsetorch::spmm_tuning_export",
                   "sparsetorch::spmm_tuning_import", "sparsetorch::spmm_tuning_stats", "sparsetorch::spmm_tuning_clear",
                   "sparsetorch::spmm_tuning_capacity"}
    defined = {s.name for s in torch._C._jit_get_all_schemas() if s.name.startswith("sparsetorch::")}
    defined -= OPCHECKED_ELSEWHERE
    assert len(defined) >= 8
    assert defined - not_traced <= seen, f"ops without an opcheck sample: {sorted(defined - not_traced - seen)}"


def test_compiled_spmm_matches_eager(device, rng):
    crow, col, values = csr_parts(rng, device)
    b = torch.randn(7, 5, device=device)
    bias = torch.randn(5, device=device)

    def f(values, b):
        y = ops.spmm(crow, col, values, b, bias=bias, activation="relu")
        return ops.bias_act(y, None, bias, "tanh")

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(values, b), f(values, b))
