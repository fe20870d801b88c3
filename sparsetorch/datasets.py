"""Loaders for the real data the examples and benchmarks use (nothing is downloaded).

Where the data is looked for (the one documented way): the folder given as ``root=`` (``--data DIR`` of the
examples and of ``python -m benchmarks``), else ``$SPARSETORCH_DATA``, else the user's cache folder
``~/.cache/sparsetorch`` (``$XDG_CACHE_HOME/sparsetorch`` where that is set). In that folder:

* ``matrices/*.mtx``: Matrix Market files (the benchmarks' real matrices);
* the Planetoid citation graphs (Cora, CiteSeer, PubMed) as the original ``ind.<name>.{x,tx,allx,y,ty,ally,
  graph,test.index}`` files (Yang et al. 2016), in any of the layouts users have: the folder that
  torch_geometric's ``Planetoid(root, name)`` download leaves (``<root>/Cora/raw/``, also ``<root>/cora/raw/``),
  a flat ``<root>/planetoid/``, or the files directly in ``<root>``. So a PyG user's cache just works:
  ``SPARSETORCH_DATA=<the root given to Planetoid>``.

``load_planetoid(name, root)`` reads a graph exactly as Kipf & Welling's GCN code prepares it: the test nodes'
rows reordered, features row-normalised, the adjacency symmetric with duplicate edges merged, the standard split
(train = the first 140/120 nodes, val = the next 500, test = the test index). CiteSeer's isolated test nodes
(missing from tx) get zero features and no label.
"""
from __future__ import annotations

import glob
import os
import pickle
import warnings
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import torch

__all__ = ["Planetoid", "load_planetoid", "planetoid_adjacency", "planetoid_available", "find_planetoid",
           "default_data_root", "data_roots", "matrix_files", "how_to_get_planetoid", "PLANETOID_FILES"]

# The Planetoid release's file suffixes; training needs them all, the adjacency alone only "graph".
PLANETOID_FILES = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
_PYG_NAMES = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}


def default_data_root() -> str:
    """``$SPARSETORCH_DATA``, else ``~/.cache/sparsetorch`` (``$XDG_CACHE_HOME/sparsetorch`` where set)."""
    env = os.environ.get("SPARSETORCH_DATA")
    if env:
        return env
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "sparsetorch")


def data_roots(root: Optional[str] = None) -> List[str]:
    """The folders searched: ``root`` when given, else :func:`default_data_root`."""
    return [os.fspath(root)] if root else [default_data_root()]


def _planetoid_candidates(root: str, name: str) -> List[str]:
    pyg = _PYG_NAMES.get(name, name)
    return [os.path.join(root, pyg, "raw"), os.path.join(root, name, "raw"), os.path.join(root, "planetoid"),
            os.path.join(root, "planetoid", pyg, "raw"), os.path.join(root, "planetoid", name, "raw"),
            os.path.join(root, "raw"), root]


def _missing(folder: str, name: str, files: Sequence[str]) -> List[str]:
    return [f"ind.{name}.{ext}" for ext in files if not os.path.isfile(os.path.join(folder, f"ind.{name}.{ext}"))]


def how_to_get_planetoid(name: str = "cora") -> str:
    """The commands that fetch a Planetoid graph and point sparsetorch at it."""
    pyg = _PYG_NAMES.get(name.lower(), name)
    return (f"get it with torch_geometric (pip install torch-geometric; it downloads to DIR/{pyg}/raw):\n"
            f"    python -c \"from torch_geometric.datasets import Planetoid; Planetoid('DIR', '{pyg}')\"\n"
            f"then set SPARSETORCH_DATA=DIR (or pass --data DIR / root='DIR')")


def find_planetoid(name: str = "cora", root: Optional[str] = None, files: Sequence[str] = PLANETOID_FILES) -> str:
    """The folder holding ``ind.<name>.<ext>`` for every ``ext`` in ``files`` (see the module docstring for
    where it looks); FileNotFoundError naming what is missing and how to get it otherwise."""
    name = name.lower()
    partial = []
    searched = []
    for r in data_roots(root):
        for folder in _planetoid_candidates(r, name):
            if not os.path.isdir(folder):
                continue
            missing = _missing(folder, name, files)
            if not missing:
                return folder
            if len(missing) < len(files):
                partial.append(f"{folder} lacks {', '.join(missing)}")
        searched.append(r)
    where = ", ".join(searched) or "(no folder)"
    detail = ("; " + "; ".join(partial)) if partial else ""
    raise FileNotFoundError(
        f"no Planetoid data for {name!r}: looked for ind.{name}.{{{','.join(files)}}} under {where} (in <root>/"
        f"{_PYG_NAMES.get(name, name)}/raw, <root>/{name}/raw, <root>/planetoid and <root>){detail}.\n"
        + how_to_get_planetoid(name))


def planetoid_available(name: str = "cora", root: Optional[str] = None, graph_only: bool = False) -> bool:
    """Whether :func:`load_planetoid` (``graph_only``: :func:`planetoid_adjacency`) finds its files."""
    try:
        find_planetoid(name, root, ("graph",) if graph_only else PLANETOID_FILES)
        return True
    except FileNotFoundError:
        return False


def matrix_files(root: Optional[str] = None) -> List[str]:
    """The Matrix Market files in ``<root>/matrices`` of the first data folder that has any."""
    for r in data_roots(root):
        found = sorted(glob.glob(os.path.join(r, "matrices", "*.mtx")))
        if found:
            return found
    return []


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


def _read_planetoid(folder: str, name: str, ext: str):
    with open(os.path.join(folder, f"ind.{name}.{ext}"), "rb") as f, warnings.catch_warnings():
        # The pickles name scipy.sparse.csr.csr_matrix, a module path SciPy deprecates.
        warnings.simplefilter("ignore", DeprecationWarning)
        return pickle.load(f, encoding="latin1")


def planetoid_adjacency(name: str = "cora", root: str | None = None, n: int | None = None):
    """The graph as stored (directed dict of lists): scipy CSR of ones, duplicate edges merged,
    no symmetrisation; (n, n) with n = the largest node id + 1 unless given."""
    import scipy.sparse as sp

    name = name.lower()
    graph = _read_planetoid(find_planetoid(name, root, ("graph",)), name, "graph")
    rows = np.array([s for s, dsts in graph.items() for _ in dsts], dtype=np.int64)
    cols = np.array([d for dsts in graph.values() for d in dsts], dtype=np.int64)
    if n is None:
        n = int(max(rows.max(), cols.max())) + 1
    adj = sp.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=(n, n))
    adj.sum_duplicates()
    adj.data[:] = 1.0
    return adj


def load_planetoid(name: str = "cora", root: str | None = None) -> Planetoid:
    """The graph, features, labels and standard split (module docstring); FileNotFoundError naming the missing
    files and how to get them when the data is not found."""
    import scipy.sparse as sp

    name = name.lower()
    folder = find_planetoid(name, root)
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
    adj = planetoid_adjacency(name, folder, n)
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
