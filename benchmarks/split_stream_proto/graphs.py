"""The graphs the split-route prototype and benchmarks/spmm_split_stream_cuda.py time: power-law at three
exponents (100k and 1M nodes, mean degree 20) and a uniform 100k graph, as int32 CSR tensors on a device."""
import time

import numpy as np
import torch

from sparsetorch.bench.suites import power_law_graph, random_graph

# (name, kind, nodes, exponent, seed)
SPECS = [("pl100k a=1.2", "power", 100_000, 1.2, 2), ("pl100k a=1.5", "power", 100_000, 1.5, 2),
         ("pl100k a=2.0", "power", 100_000, 2.0, 2), ("rand100k", "random", 100_000, 0, 1),
         ("pl1M a=1.5", "power", 1_000_000, 1.5, 4), ("pl1M a=1.2", "power", 1_000_000, 1.2, 4),
         ("pl1M a=2.0", "power", 1_000_000, 2.0, 4)]


def load(spec, dev):
    """(SciPy graph with sorted columns, crow int32, col int32, values float32 on dev); prints its size."""
    name, kind, nodes, a, seed = spec
    t0 = time.time()
    g = power_law_graph(nodes, 20, seed, a) if kind == "power" else random_graph(nodes, 20, seed)
    g.sort_indices()
    crow = torch.from_numpy(g.indptr.astype(np.int32)).to(dev)
    col = torch.from_numpy(g.indices.astype(np.int32)).to(dev)
    vals = torch.from_numpy(g.data.astype(np.float32)).to(dev)
    print(f"== {name}: nnz {g.nnz}, gen {time.time() - t0:.1f}s", flush=True)
    return g, crow, col, vals
