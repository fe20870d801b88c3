"""The opt-in O(nnz) CSR validation: runs the csr_check op and turns its code into a message.

The check runs on the matrix's own device (a kernel on CUDA that writes an error code, never a
device-side assert) and costs one synchronisation to read the 4-element result.
"""
from sparsetorch._ops import ops
from sparsetorch.csr import CSR

_OK, _CROW_FIRST, _CROW_DECREASING, _CROW_LAST, _COL_RANGE = range(5)


def validate_csr(a: CSR) -> None:
    """Raise ValueError if ``a`` is not a well-formed CSR matrix of its shape.

    Checks: ``crow_indices[..., 0] == 0``; ``crow_indices`` non-decreasing; ``crow_indices[-1] ==
    nnz`` (unbatched) or ``<= L`` (batched); every stored column in ``[0, k)``.
    """
    k = a.shape[-1]
    code, batch, pos, value = (int(v) for v in ops.csr_check(a.crow_indices, a.col_indices, k).tolist())
    if code == _OK:
        return
    where = f"[{batch}, {pos}]" if a.crow_indices.dim() == 2 else f"[{pos}]"
    if code == _CROW_FIRST:
        msg = f"crow_indices{where} = {value}, expected 0 (the first row starts at entry 0)"
    elif code == _CROW_DECREASING:
        prev = f"[{batch}, {pos - 1}]" if a.crow_indices.dim() == 2 else f"[{pos - 1}]"
        msg = (f"crow_indices is not non-decreasing: crow_indices{where} = {value} is less than "
               f"crow_indices{prev}")
    elif code == _CROW_LAST:
        width = a.col_indices.shape[-1]
        if a.crow_indices.dim() == 2:
            msg = (f"crow_indices{where} = {value} exceeds the {width} entries per batch of col_indices "
                   f"(shape {tuple(a.col_indices.shape)})")
        else:
            msg = f"crow_indices{where} = {value}, expected nnz = {width} (the length of col_indices)"
    elif code == _COL_RANGE:
        where = f"[{batch}, {pos}]" if a.col_indices.dim() == 2 else f"[{pos}]"
        msg = f"col_indices{where} = {value} is out of range for a matrix with {k} columns"
    else:  # pragma: no cover - a code this file does not know means a version mismatch
        msg = f"csr_check returned unknown code {code}"
    raise ValueError(f"invalid CSR matrix of shape {a.shape}: {msg}")
