"""Calls for ncu: torch.sparse.mm and st.spmm (split route) once each on the 1M-node power-law graph
(exponent from argv, default 1.2), fp32, n = 128, inside NVTX ranges "torch" and "split":
    ncu --nvtx --nvtx-include "torch/" --nvtx-include "split/" --metrics gpu__time_duration.sum,\
        dram__bytes_read.sum,lts__t_sector_hit_rate.pct python3 benchmarks/_prof_l2.py 1.2
"""
import sys

import torch

import sparsetorch as st
from sparsetorch.bench.suites.graphs import power_law_graph

e = float(sys.argv[1]) if len(sys.argv) > 1 else 1.2
a = power_law_graph(1_000_000, 20, 4, e)
a.sum_duplicates()
a.sort_indices()
m = a.shape[0]
A = torch.sparse_csr_tensor(torch.from_numpy(a.indptr).long().cuda(), torch.from_numpy(a.indices).long().cuda(),
                            torch.from_numpy(a.data).float().cuda(), (m, m))
B = torch.randn(m, 128, device="cuda")
sA = st.as_csr(A)
for _ in range(2):
    torch.sparse.mm(A, B)
    st.spmm(sA, B, backend="split")
torch.cuda.synchronize()
flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
for name, fn in (("torch", lambda: torch.sparse.mm(A, B)), ("split", lambda: st.spmm(sA, B, backend="split"))):
    flush.zero_()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(name)
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
print("nnz", a.nnz)
