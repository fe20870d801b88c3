"""Two-layer GCN on Cora (Kipf & Welling 2017) with sparsetorch's GCNConv, against the same model
with a dense adjacency matrix and (when installed) torch_geometric's GCNConv.

Recipe of the paper: standard Planetoid split, 16 hidden units, ReLU, dropout 0.5 on the input
of both layers, Adam lr 0.01, weight decay 5e-4 on the first layer, 200 epochs. Reported: test
accuracy of the epoch with the best validation accuracy (and of the last epoch), mean and std over
seeds; milliseconds per training epoch (forward + backward + optimiser step, synchronised), the
median over epochs after 10 warm-up epochs.

    python examples/gcn_cora.py                      # CPU or CUDA, whichever is there
    python examples/gcn_cora.py --device cuda --seeds 10 --out results.json

Data (nothing is downloaded): --data DIR, else $SPARSETORCH_DATA, else ~/.cache/sparsetorch. DIR may be the
root a torch_geometric ``Planetoid(DIR, "Cora")`` download used (DIR/Cora/raw/ind.cora.*) or hold
planetoid/ind.cora.*; without it the script says what is missing and how to get it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import sparsetorch as st
from sparsetorch.datasets import load_planetoid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's benchmarks/
from benchmarks.ratios import versus  # noqa: E402


class SparseGCN(torch.nn.Module):
    def __init__(self, in_dim, hidden, classes):
        super().__init__()
        self.conv1 = st.nn.GCNConv(in_dim, hidden, activation="relu", cached=True)
        self.conv2 = st.nn.GCNConv(hidden, classes, cached=True)

    def first_layer_parameters(self):
        return self.conv1.parameters()

    def forward(self, x, adjacency):
        x = F.dropout(x, 0.5, self.training)
        x = self.conv1(x, adjacency)
        x = F.dropout(x, 0.5, self.training)
        return self.conv2(x, adjacency)


class DenseGCN(torch.nn.Module):
    """The same model with Â as a dense (n, n) matrix and torch.mm."""

    def __init__(self, in_dim, hidden, classes):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.empty(in_dim, hidden))
        self.b1 = torch.nn.Parameter(torch.zeros(hidden))
        self.w2 = torch.nn.Parameter(torch.empty(hidden, classes))
        self.b2 = torch.nn.Parameter(torch.zeros(classes))
        for w in (self.w1, self.w2):
            torch.nn.init.xavier_uniform_(w)

    def first_layer_parameters(self):
        return [self.w1, self.b1]

    def forward(self, x, a_dense):
        x = F.dropout(x, 0.5, self.training)
        x = F.relu(a_dense @ (x @ self.w1) + self.b1)
        x = F.dropout(x, 0.5, self.training)
        return a_dense @ (x @ self.w2) + self.b2


def make_pyg(in_dim, hidden, classes):
    from torch_geometric.nn import GCNConv

    class PygGCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = GCNConv(in_dim, hidden, cached=True)
            self.conv2 = GCNConv(hidden, classes, cached=True)

        def first_layer_parameters(self):
            return self.conv1.parameters()

        def forward(self, x, edge_index):
            x = F.dropout(x, 0.5, self.training)
            x = F.relu(self.conv1(x, edge_index))
            x = F.dropout(x, 0.5, self.training)
            return self.conv2(x, edge_index)

    return PygGCN()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(model, graph_input, data, device, epochs):
    first = list(model.first_layer_parameters())
    first_ids = {id(p) for p in first}
    rest = [p for p in model.parameters() if id(p) not in first_ids]
    opt = torch.optim.Adam([{"params": first, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0.0}],
                           lr=0.01)
    x, y = data["x"], data["y"]
    train_idx, val_idx, test_idx = data["train"], data["val"], data["test"]
    best_val, test_at_best, times = -1.0, 0.0, []
    for _ in range(epochs):
        sync(device)
        t0 = time.perf_counter()
        model.train()
        opt.zero_grad(set_to_none=True)
        out = model(x, graph_input)
        loss = F.cross_entropy(out[train_idx], y[train_idx])
        loss.backward()
        opt.step()
        sync(device)
        times.append(time.perf_counter() - t0)
        model.eval()
        with torch.no_grad():
            pred = model(x, graph_input).argmax(1)
            val = (pred[val_idx] == y[val_idx]).float().mean().item()
            test = (pred[test_idx] == y[test_idx]).float().mean().item()
        if val > best_val:
            best_val, test_at_best = val, test
    return {"test_at_best_val": test_at_best, "final_test": test, "ms_per_epoch": 1e3 * statistics.median(times[10:])}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dataset", default="cora")
    ap.add_argument("--data", default=None, help="data folder (default: $SPARSETORCH_DATA, else ~/.cache/sparsetorch)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--models", default="sparsetorch,dense,pyg")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = torch.device(args.device)
    try:
        ds = load_planetoid(args.dataset, args.data)
    except FileNotFoundError as e:
        raise SystemExit(f"examples/gcn_cora.py: {e}") from None
    data = {"x": ds.features.to(device), "y": ds.labels.to(device), "train": ds.train_index.to(device),
            "val": ds.val_index.to(device), "test": ds.test_index.to(device)}
    in_dim, classes = ds.features.shape[1], ds.num_classes
    adjacency = st.from_scipy(ds.adjacency, device=device)
    a_hat_dense = st.nn.gcn_normalize(adjacency).to_dense()

    runs = {}
    for name in args.models.split(","):
        if name == "pyg":
            try:
                import torch_geometric  # noqa: F401
            except ImportError:
                print("torch_geometric not installed: skipping it")
                continue
        results = []
        for seed in range(args.seeds):
            torch.manual_seed(seed)
            if name == "sparsetorch":
                model, graph_input = SparseGCN(in_dim, 16, classes), adjacency
            elif name == "dense":
                model, graph_input = DenseGCN(in_dim, 16, classes), a_hat_dense
            elif name == "pyg":
                coo = ds.adjacency.tocoo()
                edge_index = torch.from_numpy(np.stack([coo.row, coo.col])).long().to(device)
                model, graph_input = make_pyg(in_dim, 16, classes), edge_index
            else:
                raise SystemExit(f"unknown model {name!r}")
            results.append(train(model.to(device), graph_input, data, device, args.epochs))
        acc = [r["test_at_best_val"] for r in results]
        final = [r["final_test"] for r in results]
        ms = [r["ms_per_epoch"] for r in results]
        runs[name] = {"test_acc_mean": statistics.mean(acc), "test_acc_std": statistics.pstdev(acc),
                      "final_test_acc_mean": statistics.mean(final), "ms_per_epoch_median": statistics.median(ms),
                      "seeds": len(results), "per_seed": results}
        print(f"{name:12s} test acc {100 * statistics.mean(acc):.1f} +- {100 * statistics.pstdev(acc):.1f}% "
              f"(last epoch {100 * statistics.mean(final):.1f}%), {statistics.median(ms):.2f} ms/epoch "
              f"over {len(results)} seeds on {device}")
    if "sparsetorch" in runs:
        base = runs["sparsetorch"]["ms_per_epoch_median"]
        for name, r in runs.items():
            if name != "sparsetorch":
                print(f"sparsetorch's training epoch is {versus(r['ms_per_epoch_median'] / base, name)} "
                      f"({base:.2f} vs {r['ms_per_epoch_median']:.2f} ms)")
    if args.out:
        meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "torch": torch.__version__, "dataset": args.dataset, "epochs": args.epochs}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
