"""What the packed pruned-weight forms (CSR16 in csr16.py, the slot layout in slots.py, 2:4 decode in
sparse24_decode.py) share: building one from any CSR, and the checks of the x their linear op multiplies."""
from __future__ import annotations

from typing import Optional, Tuple

import torch


def csr_parts(weight, dtype: Optional[torch.dtype] = None, device=None):
    """(crow, col, values, shape) of anything :func:`sparsetorch.as_csr` takes, 2-D (ValueError naming
    ``weight`` otherwise); ``dtype`` converts the values, ``device`` places a SciPy weight."""
    from sparsetorch.csr import as_csr

    w = as_csr(weight, device=device)
    if len(w.shape) != 2:
        raise ValueError(f"weight: expected a 2-D matrix (out_features, in_features), got shape {tuple(w.shape)}")
    values = w.values.detach()
    if dtype is not None:
        values = values.to(dtype)
    return w.crow_indices, w.col_indices, values, tuple(w.shape)


class PackedWeight:
    """Base of Csr16Weight and SlotWeight: a subclass takes (crow, col, values, shape) and sets ``shape``
    (out_features, in_features) and ``dtype``."""

    shape: Tuple[int, int]
    dtype: torch.dtype

    @classmethod
    def from_csr(cls, weight, dtype: Optional[torch.dtype] = None, device=None, **options):
        """From anything :func:`sparsetorch.as_csr` takes (an st.CSR, a torch sparse CSR tensor, a SciPy
        matrix, ...): ``dtype`` converts the values (the forms hold bfloat16/float16), ``device`` places a
        SciPy weight (torch tensors are not moved); options go to the form's constructor (SlotWeight:
        ``banded``)."""
        return cls(*csr_parts(weight, dtype, device), **options)

    def check_input(self, x: torch.Tensor) -> None:
        """x (..., in_features) of the weight's dtype, else TypeError / ValueError naming x."""
        if x.dtype != self.dtype:
            raise TypeError(f"x: expected {self.dtype} (the weight's dtype), got {x.dtype}")
        if x.dim() < 1 or x.shape[-1] != self.shape[1]:
            raise ValueError(f"x: expected shape (..., {self.shape[1]}) for a weight of shape {self.shape}, "
                             f"got {tuple(x.shape)}")
