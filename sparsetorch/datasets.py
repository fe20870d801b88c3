"""Loaders for the real data the examples and benchmarks use (nothing is downloaded).

``load_planetoid(name, root)`` reads the Planetoid citation graphs (Cora, CiteSeer) in the original
``ind.<name>.*`` format (Yang et al. 2016), exactly as Kipf & Welling's GCN code prepares them: the
test nodes' rows reordered, features row-normalised, the adjacency symmetric with duplicate
edges merged, the standard split (train = the first 140/120 nodes, val = the next 500, test = the
test index). CiteSeer's isolated test nodes (missing from tx) get zero features and no label.
"""
from __future__ import annotations

import os
import pickle
import warnings
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Planetoid", "load_planetoid", "planetoid_adjacency", "default_data_root"]


def default_data_root() -> str:
    """``$SPARSETORCH_DATA``, else ``../shared/data`` next to the repository checkout."""
    env = os.environ.get("SPARSETORCH_DATA")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "shared", "data"))


@dataclass
class Planetoid:
    adjacency: "object"  # scipy.sparse.csr_matrix (n, n), symmetric, ones, no self loops
    features: torch.Tensor  # (n, f) float32, rows sum to 1 (or 0)
    labels: torch.Tensor  # (n,) int64, -1 where unlabelled
    train_index: torch.Tensor
    val_index: torch.Tensor
    test_index: torch.Tensor

    @property
    def num_classes(self) -> int:
        return int(self.labels.max()) + 1


def _planetoid_folder(root: str | None) -> str:
    folder = os.path.join(root or default_data_root(), "planetoid")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"no Planetoid data at {folder} (set SPARSETORCH_DATA or pass root=)")
    return folder


def _read_planetoid(folder: str, name: str, ext: str):
    with open(os.path.join(folder, f"ind.{name}.{ext}"), "rb") as f, warnings.catch_warnings():
        # The pickles name scipy.sparse.csr.csr_matrix, a module path SciPy deprecates.
        warnings.simplefilter("ignore", DeprecationWarning)
        return pickle.load(f, encoding="latin1")


def planetoid_adjacency(name: str = "cora", root: str | None = None, n: int | None = None):
    """The graph as stored (directed dict of lists): scipy CSR of ones, duplicate edges merged,
    no symmetrisation; (n, n) with n = the largest node id + 1 unless given."""
    import scipy.sparse as sp

    graph = _read_planetoid(_planetoid_folder(root), name.lower(), "graph")
    rows = np.array([s for s, dsts in graph.items() for _ in dsts], dtype=np.int64)
    cols = np.array([d for dsts in graph.values() for d in dsts], dtype=np.int64)
    if n is None:
        n = int(max(rows.max(), cols.max())) + 1
    adj = sp.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=(n, n))
    adj.sum_duplicates()
    adj.data[:] = 1.0
    return adj


def load_planetoid(name: str = "cora", root: str | None = None) -> Planetoid:
    import scipy.sparse as sp

    name = name.lower()
    folder = _planetoid_folder(root)
    x, y, tx, ty, allx, ally = (_read_planetoid(folder, name, e) for e in ("x", "y", "tx", "ty", "allx", "ally"))
    with open(os.path.join(folder, f"ind.{name}.test.index")) as f:
        test_reorder = np.array([int(line) for line in f if line.strip()])
    test_range = np.sort(test_reorder)
    if name == "citeseer":  # isolated test nodes are missing from tx/ty: pad them
        full = np.arange(test_range.min(), test_range.max() + 1)
        tx_ext = sp.lil_matrix((len(full), tx.shape[1]))
        tx_ext[test_range - test_range.min(), :] = tx
        ty_ext = np.zeros((len(full), y.shape[1]))
        ty_ext[test_range - test_range.min(), :] = ty
        tx, ty = tx_ext, ty_ext
    features = sp.vstack((allx, tx)).tolil()
    features[test_reorder, :] = features[test_range, :]
    labels_onehot = np.vstack((ally, ty))
    labels_onehot[test_reorder, :] = labels_onehot[test_range, :]

    n = features.shape[0]
    adj = planetoid_adjacency(name, root, n)
    adj = ((adj + adj.T) > 0).astype(np.float32).tocsr()  # symmetric, duplicates merged
    adj.setdiag(0)
    adj.eliminate_zeros()

    feats = np.asarray(features.todense(), dtype=np.float32)
    row_sum = feats.sum(1, keepdims=True)
    feats = np.divide(feats, row_sum, out=np.zeros_like(feats), where=row_sum != 0)
    labels = np.where(labels_onehot.sum(1) > 0, labels_onehot.argmax(1), -1)
    n_train = y.shape[0]
    return Planetoid(adjacency=adj, features=torch.from_numpy(feats), labels=torch.from_numpy(labels).long(),
                     train_index=torch.arange(n_train), val_index=torch.arange(n_train, n_train + 500),
                     test_index=torch.from_numpy(test_range).long())
