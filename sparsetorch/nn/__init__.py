"""Sparse layers: a pruned linear layer stored in CSR, and graph convolutions that are drop-ins for
torch_geometric's (same constructor, forward signature and parameter names).

    import sparsetorch as st
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(4096, 4096), sparsity=0.9)
    conv = st.nn.GCNConv(1433, 16)            # as torch_geometric.nn.GCNConv
    h = conv(x, edge_index)                    # or a sparse adj_t, a Data, an st.CSR, a batched (b, n, n) CSR
    sage = st.nn.SAGEConv(1433, 16)            # as torch_geometric.nn.SAGEConv (mean aggregation)

All train with autograd through sparsetorch's ops (SpMM backward = transposed SpMM + SDDMM; a graph
layer's transpose is built with its matrix) and trace with torch.compile(fullgraph=True).
"""
from sparsetorch.nn.batching import batch_graphs, unbatch
from sparsetorch.nn.gcn import GCNConv, add_self_loops, gcn_norm, gcn_normalize
from sparsetorch.nn.linear import SparseLinear, compact, prepare
from sparsetorch.nn.sage import SAGEConv, mean_norm

__all__ = ["SparseLinear", "compact", "prepare", "GCNConv", "SAGEConv", "gcn_norm", "gcn_normalize", "mean_norm", "add_self_loops",
           "batch_graphs", "unbatch"]
