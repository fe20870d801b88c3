import sys, torch, sparsetorch as st
sys.path.insert(0, "benchmarks")
from spmm_tiled_cuda import pruned
d = float(sys.argv[1]); n = int(sys.argv[2])
a = pruned(4096, 4096, d, torch.float32, 1)
b = torch.randn(4096, n, device="cuda")
for _ in range(3): st.spmm(a, b, backend="tiled")
torch.cuda.synchronize()
