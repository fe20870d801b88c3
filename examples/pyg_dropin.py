"""torch_geometric's own GCN recipe on Cora (its examples/gcn.py), run twice: once with
``from torch_geometric.nn import GCNConv`` and once with ``from sparsetorch.nn import GCNConv``.
Nothing else changes: same model code, same data (a torch_geometric ``Data``), same optimiser,
same seeds and initial weights.

Recipe: 16 hidden units, ReLU, dropout 0.5, ``cached=True``, Adam lr 0.01 with weight decay 5e-4 on
the first layer, 200 epochs; reported: test accuracy at the epoch of best validation accuracy
(mean and std over seeds) and milliseconds per training epoch (forward + backward + Adam step,
synchronised; the median over epochs after 10 warm-up epochs).

    python examples/pyg_dropin.py                       # CUDA if present, else the CPU
    python examples/pyg_dropin.py --device cpu --seeds 10 --out results.json

Data (nothing is downloaded; sparsetorch.datasets, the same preprocessing as torch_geometric's Planetoid with
NormalizeFeatures): --data DIR, else $SPARSETORCH_DATA, else ~/.cache/sparsetorch. DIR may be the
root a torch_geometric ``Planetoid(DIR, "Cora")`` download used (DIR/Cora/raw/ind.cora.*) or hold
planetoid/ind.cora.*; without it the script says what is missing and how to get it.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's benchmarks/
from benchmarks.ratios import versus  # noqa: E402


def recipe(GCNConv, data, epochs, device):  # noqa: N803  (the class is the one thing swapped)
    """torch_geometric/examples/gcn.py, verbatim but for the data loading and the timing."""

    class GCN(torch.nn.Module):
        def __init__(self, in_channels, hidden_channels, out_channels):
            super().__init__()
            self.conv1 = GCNConv(in_channels, hidden_channels, cached=True, normalize=True)
            self.conv2 = GCNConv(hidden_channels, out_channels, cached=True, normalize=True)

        def forward(self, x, edge_index, edge_weight=None):
            x = F.dropout(x, p=0.5, training=self.training)
            x = self.conv1(x, edge_index, edge_weight).relu()
            x = F.dropout(x, p=0.5, training=self.training)
            x = self.conv2(x, edge_index, edge_weight)
            return x

    model = GCN(data.num_features, 16, int(data.y.max()) + 1).to(device)
    optimizer = torch.optim.Adam([
        dict(params=model.conv1.parameters(), weight_decay=5e-4),
        dict(params=model.conv2.parameters(), weight_decay=0)
    ], lr=0.01)

    def train():
        model.train()
        optimizer.zero_grad()
        out = model(data.x, data.edge_index, data.edge_attr)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    @torch.no_grad()
    def test():
        model.eval()
        pred = model(data.x, data.edge_index, data.edge_attr).argmax(dim=-1)
        accs = []
        for mask in [data.train_mask, data.val_mask, data.test_mask]:
            accs.append(int((pred[mask] == data.y[mask]).sum()) / int(mask.sum()))
        return accs

    best_val_acc = test_acc = 0
    times = []
    for _ in range(1, epochs + 1):
        _sync(device)
        start = time.perf_counter()
        train()
        _sync(device)
        times.append(time.perf_counter() - start)
        _, val_acc, tmp_test_acc = test()
        if val_acc > best_val_acc:
            best_val_acc = val_acc
            test_acc = tmp_test_acc
    warm = times[10:] if len(times) > 10 else times
    return {"test_acc": test_acc, "ms_per_epoch": 1e3 * statistics.median(warm)}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cora_data(root, device):
    """Cora as torch_geometric's Planetoid(transform=NormalizeFeatures()) gives it."""
    from torch_geometric.data import Data

    from sparsetorch.datasets import load_planetoid

    ds = load_planetoid("cora", root)
    coo = ds.adjacency.tocoo()
    n = ds.features.shape[0]
    masks = {}
    for name, index in (("train", ds.train_index), ("val", ds.val_index), ("test", ds.test_index)):
        mask = torch.zeros(n, dtype=torch.bool)
        mask[index] = True
        masks[f"{name}_mask"] = mask
    edge_index = torch.from_numpy(np.stack([coo.row, coo.col])).long()
    return Data(x=ds.features, edge_index=edge_index, y=ds.labels, **masks).to(device)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--data", default=None, help="data folder (default: $SPARSETORCH_DATA, else ~/.cache/sparsetorch)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if importlib.util.find_spec("torch_geometric") is None:
        raise SystemExit("examples/pyg_dropin.py compares against torch_geometric, which is not installed: "
                         "pip install torch-geometric (bash scripts/install.sh test installs it)")
    try:
        data = cora_data(args.data, device)
    except FileNotFoundError as e:
        raise SystemExit(f"examples/pyg_dropin.py: {e}") from None

    from torch_geometric.nn import GCNConv as PygGCNConv

    from sparsetorch.nn import GCNConv as SparseGCNConv

    runs = {}
    for name, conv in (("torch_geometric", PygGCNConv), ("sparsetorch", SparseGCNConv)):
        results = []
        for seed in range(args.seeds):
            torch.manual_seed(seed)  # the same initial weights for both (same init scheme and order)
            results.append(recipe(conv, data, args.epochs, device))
        acc = [r["test_acc"] for r in results]
        ms = [r["ms_per_epoch"] for r in results]
        runs[name] = {"test_acc_mean": statistics.mean(acc), "test_acc_std": statistics.pstdev(acc),
                      "ms_per_epoch_median": statistics.median(ms), "seeds": len(results), "per_seed": results}
        print(f"{name:16s} test acc {100 * statistics.mean(acc):.1f} +- {100 * statistics.pstdev(acc):.1f}% "
              f"over {len(results)} seeds, {statistics.median(ms):.2f} ms/epoch on {device}")
    ref, ours = runs["torch_geometric"], runs["sparsetorch"]
    print(f"accuracy difference (sparsetorch - torch_geometric): "
          f"{100 * (ours['test_acc_mean'] - ref['test_acc_mean']):+.1f} points; sparsetorch's training epoch is "
          f"{versus(ref['ms_per_epoch_median'] / ours['ms_per_epoch_median'], 'torch_geometric')} "
          f"({ours['ms_per_epoch_median']:.2f} vs {ref['ms_per_epoch_median']:.2f} ms)")
    if args.out:
        meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "torch": torch.__version__, "epochs": args.epochs}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "runs": runs}, f, indent=1)
    return runs


if __name__ == "__main__":
    main()
