"""Sparse layers: a pruned linear layer stored in CSR, and Kipf & Welling's graph convolution.

    import sparsetorch as st
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(4096, 4096), sparsity=0.9)
    conv = st.nn.GCNConv(1433, 16, activation="relu")
    h = conv(x, adjacency)            # adjacency: anything st.as_csr takes, (n, n) or batched (b, n, n)

Both train with autograd through sparsetorch's ops (SpMM backward = transposed SpMM + SDDMM) and
trace with torch.compile(fullgraph=True).
"""
from sparsetorch.nn.batching import batch_graphs, unbatch
from sparsetorch.nn.gcn import GCNConv, add_self_loops, gcn_normalize
from sparsetorch.nn.linear import SparseLinear

__all__ = ["SparseLinear", "GCNConv", "gcn_normalize", "add_self_loops", "batch_graphs", "unbatch"]
