"""Pruned-weight formats: the forms a pruned (out_features, in_features) weight can be multiplied in.

``st.nn.SparseLinear`` holds the weight as CSR and chooses among these per token count (it times them); the
classes below are for callers who want one form by itself:

    BitmapWeight, bitmap_linear   bitmap tiles for tensor cores (bitmap.py)
    SlotWeight, slot_linear       the same tiles, each value stored with its fragment slot (slots.py)
    Csr16Weight, csr16_linear     CSR with value and 16-bit column in one word, few tokens (csr16.py)
    Sparse24Weight, prune_2to4_mask   2:4 on sparse tensor cores plus a CSR residual (sparse24.py)
    Sparse24DecodeWeight, sparse24_decode_linear   a pure 2:4 weight in mma.sp register order, few tokens
                                  (sparse24_decode.py)

Which weights to keep (wanda.py; SparseLinear.from_dense uses the same mask):

    prune_mask        magnitude or importance-weighted mask, "global", "row" or "2:4"
    wanda_prune       Wanda: |W_ij| * ||X_j||_2, with input_norms collecting ||X_j|| from calibration batches

Each ``*Weight.from_csr`` takes anything :func:`sparsetorch.as_csr` takes. Also here: packed.py (what the
packed forms share) and blocked.py (the strip layout of SpmmPlan's "blocked" route).
"""
from sparsetorch.pruned.bitmap import BitmapWeight, bitmap_linear
from sparsetorch.pruned.csr16 import Csr16Weight, csr16_linear
from sparsetorch.pruned.slots import SlotWeight, slot_linear
from sparsetorch.pruned.sparse24 import Sparse24Split, Sparse24Weight, prune_2to4_mask
from sparsetorch.pruned.sparse24_decode import Sparse24DecodeWeight, sparse24_decode_linear
from sparsetorch.pruned.wanda import input_norms, prune_mask, wanda_prune

__all__ = ["BitmapWeight", "bitmap_linear", "Csr16Weight", "csr16_linear", "SlotWeight", "slot_linear",
           "Sparse24Split", "Sparse24Weight", "prune_2to4_mask", "Sparse24DecodeWeight", "sparse24_decode_linear",
           "input_norms", "prune_mask", "wanda_prune"]
