"""The rule that decides a pruned weight's form without timing anything: the first call of a token-count
bucket takes it (SparseLinear, sparsetorch/nn/linear.py), and online samples or ``prepare()`` refine it
(sparsetorch/tuning.py). It reads the weight's pattern (sparsetorch/pruned/forms.py: shape, dtype, density,
whether it is 2:4), the token count and what the build can run.

The thresholds are the crossovers measured on H100 and H200 (bf16, Llama MLP shapes 4096 x 4096,
11008 x 4096, 4096 x 11008 at 50-95% unstructured sparsity and 2:4; each form timed with a clean L2 against
``F.linear``; ``python -m benchmarks --suites pruned`` reproduces them; times relative to dense):

* 2:4 decode kernel: 0.62-0.76 at N = 1, 0.71-0.88 at N = 16; at N = 32 0.8-0.9 on tall weights
  (out >= in) and 1.3 on wide ones. cuSPARSELt's 2:4 with its searched algorithm: 0.91-1.44 at N = 128,
  0.68-0.76 at N = 2048; with its default algorithm (no search: a bucket prepare() did not decide) 1.5-2.4
  at N = 2048 (H100, 2026-12-07, the three shapes) and 1.0 at 136 tokens, 1.7-2.5 at 264-2001 of 14336 x 4096.
  The search costs tens of calls (~0.1 s per bucket), so the rule never takes the 2:4 form: ``prepare()``
  searches and times it, and its decisions (with the algorithm) persist in the cache file.
* CSR16 at N = 1: 0.29-0.37 at 90-95%, 0.65-0.71 at 70%, 0.93-0.99 at 50%; 1.5-2 at N = 16 and 70%.
* slots: 0.47-0.65 at N = 1 and 90-95%; 0.58-0.73 at N = 16 and 90-95%, 0.92-1.04 at 70%; 2.2-4.5 at N = 128.
* bitmap at 50%, N = 1: 0.86-0.97 on the H100 but 1.02-1.2 on the H200: not taken without a measurement.
* Past these, dense: every sparse form re-reads its weight per tile of tokens.

Elsewhere (CPU, float32/float64) the CSR routes against the dense GEMM, by density (``DENSE_CROSSOVER``).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch

__all__ = ["first_choice", "timed_forms", "compact_form", "compact_choice", "COMPACT_STORED_MAX_TOKENS", "build_cost",
           "gain", "rents", "REPAY_AT_ONCE_CALLS"]

_HALF = (torch.float16, torch.bfloat16)
# A compact layer runs its stored form up to these token counts and a transient dense expansion above (one
# kernel, then the GEMM at dense speed). Measured on an H100 (bf16, 14336 x 4096, the stored form's call
# against expansion + F.linear, us; docs/performance.md, the serving sequence):
#   2:4 decode     N = 16: 35 / 136, 64: 87 / 134, 128: 172 / 135, 256: 340 / 141
#   slots at 90%   N = 16: 39 / 186, 64: 76 / 183, 128: 140 / 185, 256: 266 / 191
#   slots at 70%   N = 16: 61 / 220, 64: 107 / 218, 128: 198 / 220, 256: 382 / 226
# The first count of a bucket (powers of 2) decides it: up to 128 the stored form costs at most as much over
# the bucket (2:4 decode: even at ~96 tokens, ahead below, behind above) and holds no transient buffer; in
# the bucket up to 256 expanding wins.
COMPACT_STORED_MAX_TOKENS = {"2:4 decode": 128, "slots": 128, "csr": 1 << 62}


def _ok(available: Dict[str, Optional[str]], form: str) -> bool:
    return form in available and available[form] is None


def _dense_crossover(device: torch.device, dtype: torch.dtype) -> float:
    """st.spmm's density above which the dense GEMM wins (functional.DENSE_CROSSOVER, the one table)."""
    from sparsetorch.functional import _crossover

    return _crossover(torch.device(device), dtype)


def first_choice(pattern, tokens: int, available: Dict[str, Optional[str]]) -> str:
    """The form for ``tokens`` rows of x, by rule (see the module docstring). ``available``: form name ->
    None where it applies (forms.applicable)."""
    p, n = pattern, int(tokens)
    if p.device.type != "cuda" or p.dtype not in _HALF:
        return "csr" if p.density <= _dense_crossover(p.device, p.dtype) else "dense"
    out_f, in_f = p.shape
    if p.is_24:
        if _ok(available, "2:4 decode") and (n <= 16 or (n <= 32 and out_f >= in_f)):
            return "2:4 decode"
        return "dense"  # not cuSPARSELt without its algorithm search (module docstring)
    d = p.density
    if _ok(available, "csr16") and d <= 0.35 and (n <= 2 or (n <= 4 and d <= 0.15)):
        return "csr16"
    if _ok(available, "slots") and ((n <= 8 and d <= 0.35) or (n <= 16 and d <= 0.15)):
        return "slots"
    return "dense"


# Whether a form is worth its build (SparseLinear's eager inference calls, sparsetorch/nn/linear.py): a build
# costs once, the form gains on each call, and the calls to come are unknown, so a bucket that wants a form
# runs dense (the rent) until what the form would have gained on those calls reaches its build cost (then it
# buys): never more than twice the cost of knowing the future. Both in calls of the dense weight at a few
# tokens (memory-bound: flat up to ~64 tokens), fitted to H100 measurements (bf16, 14336 x 4096 at 70% per
# row, 90% global and 2:4; docs/performance.md, the serving sequence's build pieces; dense 55 us):
#   build   slots 3.2 ms at density 0.3, 1.4 ms at 0.1 (a sort); CSR16 0.40 / 0.23 ms; 2:4 decode from a
#           2:4 pruning's CSR 0.83 ms (the pair-layout check and one kernel; a from_dense pruning now skips
#           the check, 0.40 ms: not measured since, and below REPAY_AT_ONCE_CALLS either way)
#   gain    the times against dense in the module docstring (CSR16 0.29-0.37 at 90-95%, 0.65-0.71 at 70%,
#           0.93-0.99 at 50%; slots 0.47-0.65 at 90-95%, 0.81-0.82 at 70% and 1-8 tokens; 2:4 decode 0.62-0.88)
# At 70% per row the slot layout repays its build after ~310 calls, CSR16 after ~25; at 90% after ~60 and ~7;
# 2:4 decode after ~60. A form that repays its build within REPAY_AT_ONCE_CALLS calls is built when first
# chosen, as are forms without an entry (bitmap; the 2:4 form, which waits for a repeated token count itself):
# the rent matters only where a build costs many calls' gain (the slot layout below ~80% sparsity: at 70%, 19%
# of a dense call per call), and a CUDA graph captured after a short eager warm-up then holds every form that gains much.
def _slots_build(d: float) -> float:
    return 8.0 + 170.0 * d


def _csr16_build(d: float) -> float:
    return 2.6 + 15.5 * d


_BUILD_COST = {"slots": _slots_build, "csr16": _csr16_build, "2:4 decode": lambda d: 15.0}
_GAIN = {"slots": lambda d: 0.55 - 1.2 * d, "csr16": lambda d: 0.8 - 1.6 * d, "2:4 decode": lambda d: 0.25}
MIN_GAIN = 0.02  # a form the rule or a measurement took gains something; never divide a build by nothing
REPAY_AT_ONCE_CALLS = 128


def build_cost(form: str, pattern) -> Optional[float]:
    """What building ``form`` for ``pattern`` costs, in dense calls; None where no model is kept (built
    when first chosen)."""
    cost = _BUILD_COST.get(form)
    return None if cost is None else cost(pattern.density)


def gain(form: str, pattern) -> float:
    """The fraction of a dense call ``form`` saves per call where it was chosen."""
    return max(MIN_GAIN, _GAIN[form](pattern.density))


def rents(form: str, pattern) -> bool:
    """Whether ``form`` waits to be repaid before it is built: it has a cost model and repays its build only
    after more than REPAY_AT_ONCE_CALLS calls."""
    cost = build_cost(form, pattern)
    return cost is not None and cost > REPAY_AT_ONCE_CALLS * gain(form, pattern)


def timed_forms(pattern, tokens: int, names):
    """The forms ``prepare()`` times for ``tokens`` rows, of the applicable ``names``; on CUDA in half precision:
    - not the CSR SpMM where a packed form applies or from 128 tokens. There it lost in every case of the pruned
      suite on the H100 (bf16, 4096 x 4096 and 11008 x 4096 at 50-95% and 2:4): its best route took 1.9-40x the
      best packed form's time at N = 1 and 16 and 20-100x dense's at N = 128 and 2048 (10-20 ms a call of an
      11008 x 4096 layer at N = 2048: timing it cost about 0.1 s of prepare(), an estimate);
    - for a 2:4 pattern where the decode layout applies, only 2:4 decode, dense and cuSPARSELt's 2:4: by bytes, slots and CSR16 move 2 bytes per position of the weight (4 per kept value) against
      the decode layout's 1.125, and the bitmap layout moves the decode layout's bytes with a kernel that spends
      ~400 instructions per group of 16 x 64 finding where its values go (pruned/slots.py); building and timing
      them cost prepare() a build each (8-9 ms for slots at 70%, more at 50%) and a timing per bucket. And the
      2:4 form (cuSPARSELt, whose algorithm search is most of its timing) from 64 tokens only: at 16 it took
      2.6-12x the decode kernel's time (pruned suite, H100: 4096 x 4096, 11008 x 4096, 4096 x 11008);
    - for any other pattern (the 2:4 form then carries a CSR residual), the 2:4 form from 1024 tokens only: at 90%
      global on a 14336 x 4096 layer (H100, 2026-12-07) it won no bucket of 64-2048 tokens and its algorithm
      searches took 0.97 s of prepare()'s 1.36 s; where it won before, it was at 2048 (H200, 1.10x dense)."""
    packed = {"csr16", "slots", "bitmap", "2:4 decode", "2:4"}
    if pattern.device.type != "cuda" or pattern.dtype not in _HALF or len(names) <= 1:
        return list(names)
    if pattern.is_24 and "2:4 decode" in names:
        timed = ("2:4 decode", "2:4", "dense") if int(tokens) >= 64 else ("2:4 decode", "dense")
        return [name for name in names if name in timed]
    if not pattern.is_24 and int(tokens) < 1024:
        names = [name for name in names if name != "2:4"]
    if int(tokens) >= 128 or packed.intersection(names):
        return [name for name in names if name != "csr"]
    return list(names)


def compact_form(pattern, available: Dict[str, Optional[str]]) -> str:
    """The one form a compact layer stores: 2:4 decode for a 2:4 pattern, slots for other half-precision
    weights (the layout that serves the most token counts near the memory floor), else the CSR."""
    if pattern.is_24 and _ok(available, "2:4 decode"):
        return "2:4 decode"
    if pattern.dtype in _HALF and _ok(available, "slots"):
        return "slots"
    return "csr"


def compact_choice(stored: str, pattern, tokens: int) -> str:
    """A compact layer's route for ``tokens`` rows: its stored form, or "expand" (the dense weight made
    for the call and freed after)."""
    if stored == "csr":
        if pattern.device.type != "cuda":
            return "csr"
        return "csr" if pattern.density <= _dense_crossover(pattern.device, pattern.dtype) else "expand"
    return stored if tokens <= COMPACT_STORED_MAX_TOKENS[stored] else "expand"
