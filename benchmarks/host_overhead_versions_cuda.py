"""Host time per call of the plan-less default st.spmm on a small problem (1000 x 1000, 10 per row,
n = 16: the GPU work is a few microseconds, so the host sets the pace), for two builds of sparsetorch
on the same host, interleaved: the fast-by-default issue asks the default call to stay within 10% of
the host time it had before that work (b1c65eb: ~14 us on the host it was measured on), and host
times differ from host to host (torch.mm alone: 17.7-26 us on the H100 hosts of 2026-11-23).

    python benchmarks/host_overhead_versions_cuda.py OLD_TREE NEW_TREE [--rounds 3]

Each tree holds a built sparsetorch (sparsetorch/_C*.so); every measurement runs in a fresh process
with that tree first on sys.path. Prints, per round and tree, st.spmm (torch CSR tensor),
torch.sparse.mm and torch.mm host us per call (3000 calls after 50 warm-up calls, best of 3).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np, torch
import scipy.sparse as sp
import sparsetorch as st

rng = np.random.default_rng(31)
rows = np.repeat(np.arange(1000), 10)
cols = np.concatenate([rng.choice(1000, 10, replace=False) for _ in range(1000)])
a = sp.csr_matrix((rng.standard_normal(rows.size).astype(np.float32), (rows, cols)), shape=(1000, 1000))
A = torch.sparse_csr_tensor(torch.from_numpy(a.indptr).int(), torch.from_numpy(a.indices).int(),
                            torch.from_numpy(a.data), (1000, 1000)).cuda()
B = torch.randn(1000, 16, device="cuda")
D = torch.randn(1000, 1000, device="cuda")

def host_us(fn, reps=3000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6

ref = torch.from_numpy(a.astype(np.float64) @ B.double().cpu().numpy())
assert torch.allclose(st.spmm(A, B).double().cpu(), ref, rtol=1e-4, atol=1e-4)
print(json.dumps({name: min(host_us(fn) for _ in range(3)) for name, fn in (
    ("st.spmm", lambda: st.spmm(A, B)), ("torch.sparse.mm", lambda: torch.sparse.mm(A, B)),
    ("torch.mm", lambda: torch.mm(D, B)))}))
"""


def run(tree: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True,
                         cwd=os.path.abspath(tree))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    results = {"old": [], "new": []}
    for r in range(args.rounds):
        for key, tree in (("old", args.old), ("new", args.new)):
            res = run(tree)
            results[key].append(res)
            print(f"round {r}, {key} ({tree}): " + ", ".join(f"{k} {v:.1f} us" for k, v in res.items()), flush=True)
    best = {key: {k: min(x[k] for x in v) for k in v[0]} for key, v in results.items()}
    print(f"best of rounds: old {best['old']}, new {best['new']}; new / old st.spmm "
          f"{best['new']['st.spmm'] / best['old']['st.spmm']:.3f}, relative to torch.sparse.mm: old "
          f"{best['old']['st.spmm'] / best['old']['torch.sparse.mm']:.3f}, new "
          f"{best['new']['st.spmm'] / best['new']['torch.sparse.mm']:.3f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
