"""What SparseLinear's two packed few-token forms share, tested once for both: the slot layout
(sparsetorch/pruned/slots.py, format="slots") and CSR16 (sparsetorch/pruned/csr16.py, format="csr16"). Each form's own
kernel, layout and bad-input tests are in tests/test_slots.py and tests/test_csr16.py."""
import numpy as np
import pytest
import torch

import sparsetorch as st
from sparsetorch.pruned import forms as form_classes
from sparsetorch.pruned.csr16 import Csr16Weight, csr16_linear
from sparsetorch._ops import ops
from sparsetorch.pruned.slots import SlotWeight, slot_linear
from _helpers import assert_matches, linear_reference, random_csr, randn

HALF_DTYPES = [torch.bfloat16, torch.float16]


def slots_bytes(layer):
    return 4 * (3 + 3 * layer.nnz)  # 2 strips x 1 chunk + 1 offsets, an entry, a slot and a target per nonzero


def slots_compact_bytes(layer):
    return 4 * (3 + layer.nnz)  # offsets and entries: a compact layer keeps no map from the CSR's order


def csr16_bytes(layer):
    # The entries; the row pointers are the layer's own int32 tensor (counted under "csr"), else a copy.
    shared = layer.crow_indices.dtype == torch.int32
    return 4 * ((0 if shared else 25) + layer.nnz)


# form: (the form's class in sparsetorch/pruned/forms.py, the op, the weight class, bytes of the form in
# memory(), the token-count bucket past the form's limit and a token count in it)
FORMS = {
    "slots": ("SlotsForm", slot_linear, SlotWeight, slots_bytes, (1024, 600)),
    "csr16": ("Csr16Form", csr16_linear, Csr16Weight, csr16_bytes, (128, 100)),
}


# form: the raw op on the weight's index tensors with `entries` in place of the weight's own
RAW_OPS = {
    "slots": lambda x, w, entries: ops.slot_linear(x, w.offsets, entries, w.shape[0]),
    "csr16": lambda x, w, entries: ops.csr16_linear(x, w.crow, entries),
}


@pytest.mark.parametrize("form", FORMS)
def test_skewed_rows_and_non_contiguous_x(device, rng, form):
    """One row holding every column, rows of one entry and empty rows; x a transposed view and x sliced from
    a wider tensor (both copied into the aligned layout the kernels read); entries as a view 4 bytes into a
    buffer (not 16-byte aligned: the CUDA ops copy them)."""
    _, op, cls, _, _ = FORMS[form]
    m, k = 64, 600
    a = random_csr(rng, m, k, 0.01).tolil()
    a[5, :] = rng.standard_normal(k)
    a = a.tocsr()
    crow = torch.from_numpy(a.indptr.astype(np.int64)).to(device)
    col = torch.from_numpy(a.indices.astype(np.int64)).to(device)
    values = torch.from_numpy(a.data).to(dtype=torch.bfloat16, device=device)
    a.data = values.double().cpu().numpy()
    w = cls(crow, col, values, (m, k))
    xt = randn(rng, k, 5, dtype=torch.bfloat16, device=device).t()
    assert_matches(op(xt, w), linear_reference(a, xt), torch.bfloat16)
    wide = randn(rng, 5, k + 3, dtype=torch.bfloat16, device=device)[:, 3:]
    assert_matches(op(wide, w), linear_reference(a, wide), torch.bfloat16)
    shifted = torch.cat([w.entries.new_zeros(1), w.entries])[1:]
    assert_matches(RAW_OPS[form](xt, w, shifted), linear_reference(a, xt), torch.bfloat16)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_sparse_linear_form(device, dtype, form, monkeypatch):
    """SparseLinear(format=form): forward, new values, gradients through the layer's CSR backward."""
    class_name, op, _, form_bytes, _ = FORMS[form]
    torch.manual_seed(3)
    base = st.nn.SparseLinear.from_dense(torch.nn.Linear(48, 24).to(device=device, dtype=dtype), sparsity=0.8,
                                         activation="gelu")
    layer = st.nn.SparseLinear(48, 24, base.crow_indices, base.col_indices, base.values.detach().clone(),
                               base.bias.detach().clone(), activation="gelu", format=form)
    x = torch.randn(5, 48, device=device, dtype=dtype)
    w = base.to_dense().detach().double()
    z = x.double() @ w.T + base.bias.detach().double()
    with torch.no_grad():
        assert_matches(layer(x), torch.nn.functional.gelu(z), dtype, input_scale=z)
        layer.values.mul_(-2.0)
        z2 = x.double() @ (-2.0 * w).T + base.bias.detach().double()
        assert_matches(layer(x), torch.nn.functional.gelu(z2), dtype, input_scale=z2)
    assert layer.memory()[form] == form_bytes(layer)

    calls = []
    cls = getattr(form_classes, class_name)
    original = cls.__call__
    monkeypatch.setattr(cls, "__call__", lambda *a, **k: calls.append(1) or original(*a, **k))
    xg = x.clone().requires_grad_()
    layer(xg).float().sum().backward()
    assert calls, f"the {form} form ran the forward of a call that records gradients (not the CSR route)"
    assert layer.values.grad is not None and xg.grad is not None
    ref_x = x.double().requires_grad_()
    ref_w = (-2.0 * w).requires_grad_()
    torch.nn.functional.gelu(ref_x @ ref_w.T + base.bias.detach().double()).sum().backward()
    assert_matches(xg.grad, ref_x.grad, dtype)
    rows = torch.repeat_interleave(torch.arange(24, device=device), torch.diff(layer.crow_indices.long()))
    assert_matches(layer.values.grad, ref_w.grad[rows, layer.col_indices.long()], dtype)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the auto route times CUDA forms")
@pytest.mark.parametrize("form", FORMS)
def test_sparse_linear_prepare_times_form(form):
    _, _, _, _, (past_bucket, past_tokens) = FORMS[form]
    torch.manual_seed(4)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(512, 256).cuda().bfloat16(), sparsity=0.9)
    layer.prepare([3, past_tokens])
    x = torch.randn(3, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        y = layer(x)
    reason = form_classes.applicable(layer._pattern(), 3)[form]
    if reason is not None:  # a build without tensor-core mma code for this GPU (compute_75): never timed
        assert "mma" in reason and not st.cuda_features()["mma"]
        assert form not in layer.route_times[4]
        pytest.skip(f"{form}: {reason}")
    assert form in layer.route_times[4]
    ref = torch.nn.functional.linear(x.double(), layer.to_dense().detach().double(), layer.bias.detach().double())
    assert_matches(y, ref, torch.bfloat16)
    assert form not in layer.route_times[past_bucket]  # beyond the form's token limit: not a candidate


def test_compact_slots_layer_holds_offsets_and_entries_only():
    torch.manual_seed(5)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(48, 24).bfloat16(), sparsity=0.8).compact()
    assert layer.stored_format == "slots" and layer.memory()["stored"] == slots_compact_bytes(layer)


@pytest.mark.parametrize("form", FORMS)
def test_constructor_rejects_a_corrupt_csr(device, form):
    """The public constructor checks the CSR it packs (a column past in_features would land in another
    group or row of the layout; decreasing row pointers in none): ValueError naming the defect."""
    cls = FORMS[form][2]
    values = torch.ones(2, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="col_indices"):
        cls(torch.tensor([0, 2], device=device), torch.tensor([1, 70], device=device), values, (1, 64))
    with pytest.raises(ValueError, match="validate_csr"):
        cls(torch.tensor([0, 2, 1, 2], device=device), torch.tensor([1, 3], device=device), values, (3, 64))
