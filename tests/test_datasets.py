"""sparsetorch.datasets: where the real data is looked for (root=, $SPARSETORCH_DATA, ~/.cache/sparsetorch), the
layouts of the Planetoid files it reads (torch_geometric's raw folder, a flat planetoid/ folder, the files alone), and
the message when they are missing; the examples that need the data say so instead of failing with a traceback."""
import os
import subprocess
import sys

import pytest

from sparsetorch import datasets
from _helpers import DATA_DIR, HAS_PLANETOID
from conftest import python_env

ROOT = os.path.join(os.path.dirname(__file__), "..")
needs_cora = pytest.mark.skipif(not HAS_PLANETOID, reason=f"Planetoid data not found under {DATA_DIR}")


def _lay_out(tmp_path, folder, name="cora", skip=()):
    """Links to the Cora files under tmp_path/folder, as another layout would hold them."""
    source = datasets.find_planetoid(name, DATA_DIR)
    target = tmp_path / folder
    target.mkdir(parents=True, exist_ok=True)
    for ext in datasets.PLANETOID_FILES:
        if ext not in skip:
            os.symlink(os.path.join(source, f"ind.{name}.{ext}"), target / f"ind.{name}.{ext}")
    return target


@needs_cora
@pytest.mark.parametrize("layout", ["Cora/raw", "cora/raw", "planetoid", ".", "planetoid/Cora/raw"])
def test_planetoid_layouts(tmp_path, layout):
    """torch_geometric's Planetoid(root, "Cora") leaves root/Cora/raw/ind.cora.*; the loader reads that, the
    lowercase folder, this project's flat planetoid/ and the files directly in root, with the same result."""
    _lay_out(tmp_path, layout)
    ds = datasets.load_planetoid("cora", str(tmp_path))
    ref = datasets.load_planetoid("cora", DATA_DIR)
    assert ds.features.shape == (2708, 1433) and ds.adjacency.nnz == ref.adjacency.nnz == 10556
    assert (ds.labels == ref.labels).all() and (ds.test_index == ref.test_index).all()
    assert datasets.planetoid_available("cora", str(tmp_path))


@needs_cora
def test_missing_file_is_named_with_the_way_to_get_it(tmp_path):
    _lay_out(tmp_path, "Cora/raw", skip=("tx",))
    with pytest.raises(FileNotFoundError) as info:
        datasets.load_planetoid("cora", str(tmp_path))
    message = str(info.value)
    assert "lacks ind.cora.tx" in message and "Planetoid('DIR', 'Cora')" in message
    assert "SPARSETORCH_DATA=DIR" in message
    # The adjacency alone needs only the graph file.
    assert datasets.planetoid_adjacency("cora", str(tmp_path)).shape == (2708, 2708)


def test_default_folder_is_the_environment_else_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSETORCH_DATA", str(tmp_path / "env"))
    assert datasets.data_roots() == [str(tmp_path / "env")]
    monkeypatch.delenv("SPARSETORCH_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert datasets.data_roots() == [str(tmp_path / "xdg" / "sparsetorch")]
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert datasets.default_data_root() == str(tmp_path / "home" / ".cache" / "sparsetorch")


def test_nothing_found_names_the_folders_searched(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSETORCH_DATA", str(tmp_path))
    assert datasets.data_roots() == [str(tmp_path)]
    assert datasets.data_roots(str(tmp_path / "x")) == [str(tmp_path / "x")]  # an explicit root alone
    with pytest.raises(FileNotFoundError, match="no Planetoid data for 'citeseer'") as info:
        datasets.find_planetoid("citeseer", str(tmp_path))
    assert str(tmp_path) in str(info.value)
    assert not datasets.planetoid_available("citeseer", str(tmp_path))
    assert datasets.matrix_files(str(tmp_path)) == []


@pytest.mark.parametrize("script", ["gcn_cora.py", "pyg_dropin.py"])
def test_examples_say_what_data_is_missing(tmp_path, script):
    if script == "pyg_dropin.py":
        pytest.importorskip("torch_geometric")
    env = python_env(SPARSETORCH_DATA=str(tmp_path))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), "--device", "cpu", "--data",
                           str(tmp_path), "--epochs", "1", "--seeds", "1"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "no Planetoid data for 'cora'" in proc.stderr and "Planetoid('DIR', 'Cora')" in proc.stderr
