"""Wanda-style pruning (sparsetorch/pruned/wanda.py): prune_mask, wanda_prune, input_norms and
SparseLinear.from_dense(importance=), against a plain float64 reference written here."""
import pytest
import torch

import sparsetorch as st
from sparsetorch.pruned import input_norms, prune_mask, wanda_prune


def _reference(weight, norms, sparsity, scheme):
    """Plain Python over float64 scores: sort each comparison group by (-score, position), keep the first."""
    w = weight.detach().cpu().double()
    score = w.abs() * (norms.detach().cpu().double() if norms is not None else 1.0)
    score = torch.nan_to_num(score, nan=float("inf")).tolist()
    out_f, in_f = w.shape
    mask = [[False] * in_f for _ in range(out_f)]

    def keep_best(positions, k):
        for r, c in sorted(positions, key=lambda p: (-score[p[0]][p[1]], p))[:k]:
            mask[r][c] = True

    if scheme == "row":
        for r in range(out_f):
            keep_best([(r, c) for c in range(in_f)], round((1 - sparsity) * in_f))
    elif scheme == "global":
        keep_best([(r, c) for r in range(out_f) for c in range(in_f)], round((1 - sparsity) * out_f * in_f))
    else:
        for r in range(out_f):
            for g in range(0, in_f, 4):
                keep_best([(r, c) for c in range(g, min(g + 4, in_f))], 2)
        kept = [(r, c) for r in range(out_f) for c in range(in_f) if mask[r][c]]
        k = round((1 - sparsity) * out_f * in_f)
        if k < len(kept):
            for r, c in kept:
                mask[r][c] = False
            keep_best(kept, k)
    return torch.tensor(mask, dtype=torch.bool)


def _heavy(out_f, in_f, dtype, seed=0):
    """A weight with heavy-tailed row and column scales, and activation norms with outlier channels."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g) * torch.exp(torch.randn(out_f, 1, generator=g)) \
        * torch.exp(torch.randn(1, in_f, generator=g))
    norms = torch.rand(in_f, generator=g) + 0.1
    norms[torch.randperm(in_f, generator=g)[:2]] *= 50.0
    return w.to(dtype), norms


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scheme,sparsity", [("row", 0.5), ("row", 0.7), ("global", 0.5), ("global", 0.7),
                                             ("2:4", 0.5), ("2:4", 0.6)])
def test_masks_match_the_float64_reference(device, dtype, scheme, sparsity):
    w, norms = _heavy(12, 22, dtype)  # 22: a trailing group of 2 in 2:4
    w, norms = w.to(device), norms.to(device)
    mask = prune_mask(w, sparsity, scheme, importance=norms)
    assert mask.dtype == torch.bool and mask.shape == w.shape
    assert mask.device == w.device and torch.equal(mask.cpu(), _reference(w, norms, sparsity, scheme))
    pruned = wanda_prune(w, norms, sparsity, scheme)
    assert pruned.dtype == dtype and torch.equal(pruned, torch.where(mask, w, torch.zeros_like(w)))
    if scheme == "row":
        assert torch.all(mask.sum(1) == round((1 - sparsity) * 22))
    elif scheme == "global":
        assert int(mask.sum()) == round((1 - sparsity) * w.numel())
    else:
        padded = torch.nn.functional.pad(mask.cpu(), (0, 2))
        assert int(padded.view(12, -1, 4).sum(-1).max()) <= 2
        assert int(mask.sum()) == (12 * 11 if sparsity == 0.5 else round(0.4 * w.numel()))


def test_ties_go_to_the_lower_position_and_zero_norm_channels_go_first():
    w = torch.ones(3, 8)
    norms = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    row = prune_mask(w, 0.5, "row", importance=norms)
    assert torch.equal(row, torch.tensor([[True, False, True, True, False, True, False, False]] * 3))
    assert torch.equal(prune_mask(w, 0.5, "2:4", importance=norms)[0],
                       torch.tensor([True, False, True, False, False, True, True, False]))
    glob = prune_mask(w, 0.5, "global", importance=norms)
    assert int(glob.sum()) == 12 and not glob[:, [1, 4]].any()
    assert torch.equal(glob, _reference(w, norms, 0.5, "global"))
    for _ in range(2):  # deterministic
        assert torch.equal(prune_mask(w, 0.5, "global", importance=norms), glob)
    # every channel's norm zero: ties everywhere, still exactly k per row, by position
    assert torch.equal(prune_mask(w, 0.75, "row", importance=torch.zeros(8)),
                       torch.tensor([[True, True] + [False] * 6] * 3))


def test_from_dense_with_importance_is_wanda_and_without_is_magnitude():
    w, norms = _heavy(16, 24, torch.float32, seed=3)
    for scheme, sparsity in (("row", 0.5), ("global", 0.7), ("2:4", 0.5)):
        layer = st.nn.SparseLinear.from_dense(w, sparsity=sparsity, scheme=scheme, importance=norms)
        assert torch.equal(layer.to_dense().detach(), wanda_prune(w, norms, sparsity, scheme))
        magnitude = st.nn.SparseLinear.from_dense(w, sparsity=sparsity, scheme=scheme)
        assert torch.equal(magnitude.to_dense().detach() != 0, _reference(w, None, sparsity, scheme))
    # Wanda keeps the weights of an outlier channel that magnitude alone would drop
    w = torch.ones(4, 8)
    w[:, 7] = 0.5
    norms = torch.ones(8)
    norms[7] = 100.0
    assert wanda_prune(w, norms, 0.5, "row")[:, 7].eq(0.5).all()
    assert st.nn.SparseLinear.from_dense(w, 0.5, "row").to_dense()[:, 7].eq(0).all()


def test_nan_weight_is_kept():
    w = torch.ones(2, 4)
    w[1, 3] = float("nan")
    assert prune_mask(w, 0.75, "row", importance=torch.ones(4))[1, 3]


@pytest.mark.parametrize("call,match", [
    (lambda w, n: prune_mask(w[0], 0.5, "row"), "weight"),
    (lambda w, n: prune_mask(w.to_sparse(), 0.5, "row"), "weight"),
    (lambda w, n: prune_mask(w, 0.5, "per_column"), "scheme"),
    (lambda w, n: prune_mask(w, 1.5, "row"), "sparsity"),
    (lambda w, n: prune_mask(w, 0.3, "2:4"), "sparsity"),
    (lambda w, n: prune_mask(w, 0.5, "row", importance=n[:3]), "importance"),
    (lambda w, n: prune_mask(w, 0.5, "row", importance=-n), "importance"),
    (lambda w, n: prune_mask(w, 0.5, "row", importance=n * float("nan")), "importance"),
    (lambda w, n: wanda_prune(w, None, 0.5), "activation_norms"),
    (lambda w, n: st.nn.SparseLinear.from_dense(w, 0.5, "row", importance=n[:2]), "importance"),
])
def test_input_errors_name_the_argument(call, match):
    w, n = torch.randn(4, 8), torch.rand(8)
    with pytest.raises((ValueError, TypeError), match=match):
        call(w, n)
    with pytest.raises(TypeError, match="weight"):
        prune_mask(torch.ones(4, 8, dtype=torch.int32), 0.5, "row")


def test_input_norms_collects_the_l2_norm_of_every_linear_input():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    batches = [torch.randn(2, 4, 6), torch.randn(7, 6)]
    norms = input_norms(model, batches)
    assert set(norms) == {"0", "2"}
    xs = torch.cat([b.reshape(-1, 6) for b in batches])
    torch.testing.assert_close(norms["0"], xs.double().norm(dim=0).float())
    hidden = torch.relu(model[0](xs))
    torch.testing.assert_close(norms["2"], hidden.norm(dim=0))
    assert not model[0]._forward_pre_hooks  # hooks removed
    assert set(input_norms(model, batches[:1], modules=["2"])) == {"2"}
    with pytest.raises(ValueError, match="modules"):
        input_norms(model, batches, modules=["nope"])


def test_input_norms_finds_sparse_linear_layers():
    """A linear layer is found by its in_features / out_features (wanda.py does not import the layers): a
    SparseLinear's input is collected, a module without those attributes is not."""
    torch.manual_seed(1)
    layer = st.nn.SparseLinear.from_dense(torch.randn(5, 6), sparsity=0.5)
    model = torch.nn.Sequential(layer, torch.nn.Tanh(), torch.nn.Linear(5, 2))
    x = torch.randn(9, 6)
    norms = input_norms(model, [x])
    assert set(norms) == {"0", "2"}
    torch.testing.assert_close(norms["0"], x.norm(dim=0))
    torch.testing.assert_close(norms["2"], torch.tanh(layer(x)).detach().norm(dim=0))
