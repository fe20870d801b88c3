"""The README's tour runs as written: each Python block of its "A short tour" section is executed, on every
device under test, with its device line set to that device (the README picks CUDA when present)."""
import os
import re

import pytest

from conftest import DEVICES

pytestmark = pytest.mark.repaid_builds  # the suites and the tour run as users run them

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")
DEVICE_LINE = 'device = "cuda" if torch.cuda.is_available() else "cpu"'


def tour_blocks():
    text = open(README, encoding="utf-8").read()
    section = re.search(r"^## A short tour\n(.*?)(?=^## )", text, re.M | re.S)
    assert section, "README.md has no '## A short tour' section"
    return re.findall(r"^```python\n(.*?)^```", section.group(1), re.M | re.S)


def test_the_tour_has_runnable_blocks():
    blocks = tour_blocks()
    assert len(blocks) >= 2, "the tour lost its code blocks"
    for code in blocks:
        assert DEVICE_LINE in code, f"a tour block does not choose its device as the others do:\n{code[:200]}"


@pytest.mark.parametrize("index", range(len(tour_blocks())))
def test_tour_block_runs(device, index):
    code = tour_blocks()[index].replace(DEVICE_LINE, f"device = {device!r}")
    namespace = {"__name__": "readme_tour"}
    exec(compile(code, f"README.md tour block {index}", "exec"), namespace)
    # Each block leaves its results on the chosen device.
    results = [v for k, v in namespace.items() if k in ("C", "y", "h") and hasattr(v, "device")]
    assert results and all(v.device.type == device for v in results)


def test_a_split_run_leaves_out_the_tests_an_earlier_call_finished(tmp_path):
    """CONTRIBUTING's split GPU run: the ids in $SPARSETORCH_TESTS_DONE are deselected (conftest.py), and a
    missing file is a usage error, not a silent full run."""
    import subprocess
    import sys

    from conftest import ROOT, python_env

    done = tmp_path / "done.txt"
    done.write_text("tests/test_stats.py::test_the_layout_covers_the_vector_in_order\n")

    def run(path):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_stats.py",
                               "-k", "layout_covers or defect_is_named"], cwd=ROOT, capture_output=True, text=True,
                              env=python_env(SPARSETORCH_TESTS_DONE=str(path)), timeout=300)

    empty = tmp_path / "empty.txt"
    empty.write_text("")

    def counts(out):
        assert out.returncode == 0, out.stdout[-500:]
        found = re.search(r"(\d+) passed, (\d+) deselected", out.stdout)
        return int(found.group(1)), int(found.group(2))

    passed, deselected = counts(run(empty))  # -k keeps 2 tests of the file (more where one runs per device)
    assert passed >= 2
    assert counts(run(done)) == (passed - 1, deselected + 1)
    missing = run(tmp_path / "none.txt")
    assert missing.returncode != 0 and "SPARSETORCH_TESTS_DONE" in missing.stdout + missing.stderr
