"""Which weights a pruned layer keeps: the one place that decides (``SparseLinear.from_dense`` calls it too).

    prune_mask(weight, sparsity, scheme, importance=None)   the boolean mask of the kept weights
    wanda_prune(weight, activation_norms, sparsity, scheme)  Wanda (Sun et al. 2023): the weight pruned by
                                                            |W_ij| * ||X_j||_2, zeros where it was pruned
    input_norms(model, batches)                              ||X_j||_2 of every linear layer's input over
                                                            calibration batches, for the two above

The score of a weight is |W_ij| (magnitude), or |W_ij| * importance_j with a per-input-channel importance
(Wanda's: the L2 norm of input channel j over calibration tokens, so that a channel carrying large
activations keeps its weights). Scores are computed in float64, where the product of a bfloat16/float16/
float32 weight and a float32 norm is exact, so the mask does not depend on rounding; a NaN weight scores
+inf (it is kept, not silently dropped). Ties go to the lower position (row-major for "global").

Schemes: "global" keeps the round((1 - sparsity) * out * in) highest scores of the whole matrix; "row" the
round((1 - sparsity) * in) highest of each row (Wanda's per-output comparison group; the same nnz per row);
"2:4" the 2 highest of every 4 consecutive inputs of a row, and a sparsity above 0.5 then removes the lowest
kept scores of the whole matrix as well (the pattern stays 2:4).
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional

import torch

from sparsetorch.pruned.sparse24 import prune_2to4_mask

SCHEMES = ("global", "row", "2:4")


def _scores(weight: torch.Tensor, importance: Optional[torch.Tensor]) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.layout != torch.strided:
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight: expected a dense 2-D (out_features, in_features) tensor, got {shape}")
    if not (weight.is_floating_point()):
        raise TypeError(f"weight: expected a floating-point tensor, got {weight.dtype}")
    score = weight.detach().abs().double()
    if importance is not None:
        if not isinstance(importance, torch.Tensor):
            raise TypeError(f"importance: expected a tensor of shape ({weight.shape[1]},), got "
                            f"{type(importance).__name__}")
        if importance.shape != (weight.shape[1],):
            raise ValueError(f"importance: expected shape ({weight.shape[1]},) (one value per input channel, "
                             f"in_features), got {tuple(importance.shape)}")
        if importance.device != weight.device:
            raise ValueError(f"importance: expected the weight's device {weight.device}, got {importance.device}")
        imp = importance.detach().double()
        if not (torch.isfinite(imp).all() and (imp >= 0).all()):
            raise ValueError("importance: expected finite values >= 0 (norms of the input channels)")
        score = score * imp
    return torch.nan_to_num(score, nan=float("inf"))


def _check_sparsity(sparsity, scheme: str) -> float:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme: expected 'global', 'row' or '2:4', got {scheme!r}")
    if sparsity is None:
        return 0.5 if scheme == "2:4" else 0.9
    try:
        value = None if isinstance(sparsity, bool) else float(sparsity)  # numpy scalars, 0-d tensors
    except (TypeError, ValueError):
        value = None
    if value is None or not 0.0 <= value <= 1.0:
        raise ValueError(f"sparsity: expected a fraction in [0, 1], got {sparsity!r}")
    sparsity = value
    if scheme == "2:4" and sparsity < 0.5:
        raise ValueError(f"sparsity: scheme '2:4' removes at least half of the weights, got {sparsity}")
    return float(sparsity)


def _top(score: torch.Tensor, keep: int) -> torch.Tensor:
    """Mask of the `keep` highest entries of each row of `score` (2-D), ties to the lower position."""
    mask = torch.zeros(score.shape, dtype=torch.bool, device=score.device)
    if keep > 0:
        order = torch.sort(score, dim=1, descending=True, stable=True).indices
        mask.scatter_(1, order[:, :keep], True)
    return mask


def prune_mask(weight: torch.Tensor, sparsity: Optional[float] = None, scheme: str = "global",
               importance: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The boolean (out_features, in_features) mask of the weights kept (see the module docstring).

    ``sparsity`` is the fraction removed (default 0.9; 0.5 for "2:4"); ``importance`` (in_features,) >= 0
    multiplies |W| per input channel (None: magnitude pruning)."""
    score = _scores(weight, importance)
    sparsity = _check_sparsity(sparsity, scheme)
    out_f, in_f = score.shape
    if scheme == "row":
        return _top(score, int(round((1.0 - sparsity) * in_f)))
    keep = int(round((1.0 - sparsity) * score.numel()))
    if scheme == "global":
        return _top(score.reshape(1, -1), keep).view(out_f, in_f)
    mask = prune_2to4_mask(score)
    if keep < int(mask.sum()):
        kept = torch.where(mask, score, torch.full_like(score, -1.0))
        mask = _top(kept.reshape(1, -1), keep).view(out_f, in_f)
    return mask


def wanda_prune(weight: torch.Tensor, activation_norms: torch.Tensor, sparsity: Optional[float] = None,
                scheme: str = "row") -> torch.Tensor:
    """The weight (dense, same dtype and device) with the weights of the lowest Wanda scores
    |W_ij| * activation_norms_j set to zero; ``scheme`` "row" (Wanda's default), "global" or "2:4".

    ``activation_norms`` (in_features,): ||X_j||_2 of the layer's input channel j over calibration tokens
    (:func:`input_norms` collects them). For a SparseLinear, pass them to
    ``SparseLinear.from_dense(weight, sparsity, scheme, importance=activation_norms)`` instead: the same mask,
    without the dense copy."""
    if activation_norms is None:
        raise ValueError("activation_norms: required for Wanda pruning (for magnitude pruning use prune_mask)")
    mask = prune_mask(weight, sparsity, scheme, importance=activation_norms)
    return torch.where(mask, weight.detach(), torch.zeros((), dtype=weight.dtype, device=weight.device))


@torch.no_grad()
def input_norms(model: torch.nn.Module, batches: Iterable, modules: Optional[Iterable[str]] = None
                ) -> Dict[str, torch.Tensor]:
    """||X_j||_2 (float32, on the layer's device) of the input of every linear layer of ``model`` (or of the
    submodules named in ``modules``), over all tokens of ``model(batch)`` for each batch (a batch that is a
    tuple is unpacked into the call). A linear layer is a module with int ``in_features`` and
    ``out_features`` that takes (..., in_features) inputs: ``nn.Linear``, ``SparseLinear`` and the like.
    Returns {module name: (in_features,) norms}."""
    named = dict(model.named_modules())
    if modules is None:
        names = [n for n, m in named.items() if _is_linear_layer(m)]
    else:
        names = list(modules)
        missing = [n for n in names if n not in named]
        if missing:
            raise ValueError(f"modules: no submodule named {', '.join(map(repr, missing))} in the model")
    sums: Dict[str, torch.Tensor] = {}

    def hook(name):
        def pre(module, args):
            x = args[0].detach()
            sq = x.reshape(-1, x.shape[-1]).float().square().sum(0)
            sums[name] = sq if name not in sums else sums[name] + sq
        return pre

    handles = [named[n].register_forward_pre_hook(hook(n)) for n in names]
    try:
        for batch in batches:
            model(*batch) if isinstance(batch, tuple) else model(batch)
    finally:
        for h in handles:
            h.remove()
    return {n: s.sqrt() for n, s in sums.items()}


def _is_linear_layer(module: torch.nn.Module) -> bool:
    # By its attributes, not its class: this package does not import the layers (sparsetorch.nn imports it).
    return isinstance(module, torch.nn.Linear) or (isinstance(getattr(module, "in_features", None), int)
                                                   and isinstance(getattr(module, "out_features", None), int))
