"""What one training step of PyG's GCN recipe on Cora (examples/pyg_dropin.py) launches, with
torch_geometric's GCNConv and with sparsetorch's: torch.profiler over 20 steps after 30 warm-up steps,
the CUDA kernels and the CUDA runtime calls per step (launches, synchronisations, copies), and the wall
time per step. On a graph this small the step is bound by launches and host time, not by the GPU.

    python benchmarks/gcn_step_profile_cuda.py [--data DIR] [--cprofile]
"""
import argparse
import os
import sys
import time
from collections import Counter

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from pyg_dropin import cora_data  # noqa: E402

STEPS = 20


def make_step(GCNConv, data):  # noqa: N803
    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = GCNConv(data.num_features, 16, cached=True, normalize=True)
            self.conv2 = GCNConv(16, int(data.y.max()) + 1, cached=True, normalize=True)

        def forward(self, x, edge_index):
            x = F.dropout(x, p=0.5, training=self.training)
            x = self.conv1(x, edge_index).relu()
            x = F.dropout(x, p=0.5, training=self.training)
            return self.conv2(x, edge_index)

    model = GCN().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)

    def step():
        opt.zero_grad()
        out = model(data.x, data.edge_index)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    ap.add_argument("--cprofile", action="store_true", help="also a cProfile of 100 steps")
    args = ap.parse_args()
    import torch_geometric.nn as pyg_nn

    import sparsetorch.nn as st_nn

    data = cora_data(args.data, torch.device("cuda"))
    for name, conv in (("torch_geometric", pyg_nn.GCNConv), ("sparsetorch", st_nn.GCNConv)):
        step = make_step(conv, data)
        for _ in range(30):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(100):
            step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) / 100 * 1e3
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                step()
            torch.cuda.synchronize()
        kernels, runtime = Counter(), Counter()
        gpu_us = 0.0
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels[e.name[:90]] += 1
                gpu_us += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            elif e.name.startswith("cuda") or e.name.startswith("cu"):
                runtime[e.name] += 1
        print(f"== {name}: {wall_ms:.2f} ms per step (wall, 100 steps); GPU time {gpu_us / STEPS / 1e3:.3f} ms, "
              f"{sum(kernels.values()) / STEPS:.1f} kernels per step")
        for k, v in runtime.most_common(8):
            print(f"   runtime {k:<40} {v / STEPS:6.1f} per step")
        for k, v in kernels.most_common(40):
            print(f"   kernel  {k:<90} {v / STEPS:5.1f}")
        if args.cprofile:  # where the host time goes, per Python function
            import cProfile
            import io
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            for _ in range(100):
                step()
            torch.cuda.synchronize()
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
            print(text.getvalue())


if __name__ == "__main__":
    main()
