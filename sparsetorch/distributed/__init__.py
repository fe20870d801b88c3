"""sparsetorch.distributed: row-partitioned sparse matrices and SpMM over torch.distributed.

    import torch.distributed as dist, sparsetorch as st
    from sparsetorch.distributed import DistributedCSR

    dist.init_process_group("nccl")                    # or "gloo" on CPUs; torchrun --nproc-per-node N
    A = DistributedCSR.from_global(adjacency)          # or .scatter(A on rank 0) / .from_blocks(my rows)
    x_r = A.local_cols(x)                              # this rank's rows of the node features
    y_r = st.spmm(A, x_r, bias=b, activation="relu")   # this rank's rows of relu(A @ x + b)

Each rank holds a block of rows (balanced by entries), split into the columns it owns and the
columns others own; a product moves only the distinct rows of B the second part references (one
variable-size all-to-all, overlapped with the product of the first part), and its backward moves
their gradients back the same way. See matrix.py (the matrix), _spmm.py (the product and its
autograd), halo.py (the exchange), partition.py, graphs.py (deterministic synthetic graphs),
training.py (full-graph GCN training) and launch.py (local process groups for tests).
"""
from sparsetorch.distributed._comm import NO_MULTICAST_ENV, DistributedError, set_no_multicast_env
from sparsetorch.distributed.graphs import (node_features, node_labels, node_mask, power_law_block,
                                            power_law_degrees, power_law_graph)
from sparsetorch.distributed.halo import HaloPlan
from sparsetorch.distributed.matrix import DistributedCSR, halo_volume
from sparsetorch.distributed.partition import balanced_row_bounds, even_bounds, halo_counts
from sparsetorch.distributed.training import GCN, masked_cross_entropy, sync_gradients

__all__ = ["DistributedCSR", "DistributedError", "HaloPlan", "GCN", "NO_MULTICAST_ENV", "balanced_row_bounds",
           "even_bounds", "halo_counts", "halo_volume", "masked_cross_entropy", "node_features", "node_labels",
           "node_mask", "power_law_block", "power_law_degrees", "power_law_graph", "set_no_multicast_env",
           "sync_gradients"]
