"""GraphSAGE trained with neighbour sampling (a new subgraph every step), sparsetorch against
torch_geometric on the same batches.

    python examples/sage_neighbor_sampling.py [--nodes 300000] [--steps 30] [--device cuda]

The graph is a synthetic power-law graph (Chung-Lu, mean degree ~10), node features random, labels a
function of the features and the neighbourhood so that there is something to learn. Each step samples
fanouts [15, 10] around 1024 seed nodes (torch_geometric's NeighborLoader does this with pyg-lib or
torch-sparse; this script uses a NeighborLoader-style sampler in torch ops, so it runs without them).
Models: two SAGEConv layers (hidden 256), the layers swapped by changing one import.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import sparsetorch as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's benchmarks/
from benchmarks.suites.gnn_common import power_law_edge_index  # noqa: E402
from benchmarks.suites.minibatch import Net3, in_neighbours, sample_subgraph  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=300_000)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    nodes = args.nodes if dev.type == "cuda" else min(args.nodes, 20_000)
    graph = power_law_edge_index(nodes, 10 * nodes, seed=7, device=str(dev))
    g = torch.Generator(device=dev).manual_seed(0)
    x_all = torch.randn(nodes, 128, device=dev, generator=g)
    # Labels: the sign pattern of a random projection of each node's features plus its neighbours' mean.
    mean_nbr = torch.zeros_like(x_all).index_add_(0, graph[1], x_all[graph[0]])
    mean_nbr /= torch.bincount(graph[1], minlength=nodes).clamp(min=1).unsqueeze(1)
    proj = torch.randn(128, 2, device=dev, generator=g)
    h = (x_all + mean_nbr) @ proj
    y_all = (h[:, 0] > 0).long() * 2 + (h[:, 1] > 0).long()
    rowptr, sources = in_neighbours(graph, nodes)
    batches = []
    for _ in range(args.steps):
        seeds = torch.randperm(nodes, device=dev, generator=g)[:1024]
        n_id, edge_index = sample_subgraph(rowptr, sources, seeds, (15, 10), g)
        batches.append((x_all[n_id], edge_index, y_all[seeds]))
    print(f"graph: {nodes} nodes, {graph.shape[1]} edges; a batch: ~{batches[0][0].shape[0]} nodes, "
          f"~{batches[0][1].shape[1]} edges (fanouts [15, 10], 1024 seeds), {args.steps} steps on {dev}")

    libs = {"sparsetorch": st.nn}
    try:
        import torch_geometric.nn as pyg_nn

        libs["torch_geometric"] = pyg_nn
    except ImportError:
        print("torch_geometric is not installed: sparsetorch alone")
    times = {}
    for name, lib in libs.items():
        torch.manual_seed(0)
        model = Net3(lib, "SAGEConv", (128, 256, 4)).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=0.005)
        step_times, correct = [], 0
        for i, (x, edge_index, y) in enumerate(batches):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            out = model(x, edge_index)[:1024]
            F.cross_entropy(out, y).backward()
            opt.step()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            step_times.append(time.perf_counter() - t0)
            if i >= len(batches) - 5:
                correct += int((out.argmax(1) == y).sum())
        times[name] = statistics.median(step_times[3:] or step_times)
        print(f"{name:16s} {times[name] * 1e3:7.2f} ms per step (median), accuracy on the last 5 batches "
              f"{correct / (5 * 1024):.3f}")
    if len(times) == 2:
        ratio = times["torch_geometric"] / times["sparsetorch"]
        faster = "faster" if ratio >= 1 else "slower"
        print(f"sparsetorch: {ratio:.2f}x torch_geometric's speed per step ({faster})")


if __name__ == "__main__":
    main()
