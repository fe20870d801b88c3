"""The layers' default against every route forced on the same layer: GCNConv on the gnn suite's
power-law graph (170k nodes, 2.1M entries, 128 -> 256 channels) and SparseLinear on pruned weights
(bf16 11008 x 4096 at 90%, N = 1 and 512; fp32 4096 x 4096 at 25%, N = 1024), forward (no grad) and
forward + backward. The default is the layer as a user builds it (backend / format "auto"); each
other row is the same weights with one backend (GCNConv; SparseLinear format="csr") or format
forced. Times: median device milliseconds with the L2 zeroed before each call, after warm-up (so
measured routes and derived forms are in place, a user's steady state); every output is checked against
the default's first.

    python -m benchmarks.layer_routes_cuda [--out DIR]
"""
import argparse

import torch

import sparsetorch as st
from benchmarks._results import run_meta, write_results
from benchmarks.suites.gnn_common import power_law_edge_index
from sparsetorch import timing

GCN_BACKENDS = ("native", "balanced", "split", "cusparse")


def bench(fn):
    """Median device milliseconds of fn() (the L2 zeroed before each call)."""
    return timing.device_time(fn, l2="flush", budget_ms=100.0, max_reps=250, warmup=10)


def fwd_and_train(layer, inputs, params):
    def fwd():
        with torch.no_grad():
            return layer(*inputs)

    def train():
        for p in params:
            p.grad = None
        layer(*inputs).sum().backward()

    return fwd, train


def gcn_rows():
    n, entries = 169_343, 2_100_000
    edge_index = power_law_edge_index(n, entries, seed=7, device="cuda")
    x = torch.randn(n, 128, device="cuda")
    rows, reference = [], None
    torch.manual_seed(0)
    base = st.nn.GCNConv(128, 256, cached=True).cuda()
    for backend in ("auto",) + GCN_BACKENDS:
        layer = st.nn.GCNConv(128, 256, cached=True, backend=backend).cuda()
        layer.load_state_dict(base.state_dict())
        fwd, train = fwd_and_train(layer, (x, edge_index), list(layer.parameters()))
        out = fwd()
        if reference is None:
            reference = out
        err = ((out - reference).norm() / reference.norm()).item()
        assert err < 1e-4, (backend, err)
        rows.append({"case": "GCNConv power-law 170k, 128 -> 256, fp32", "variant": backend,
                     "fwd_ms": bench(fwd), "train_ms": bench(train)})
        print(rows[-1], flush=True)
    return rows


def linear_rows(out_f, in_f, sparsity, dtype, widths, variants, label):
    torch.manual_seed(0)
    dense = torch.nn.Linear(in_f, out_f).to(device="cuda", dtype=dtype)
    rows = []
    for n in widths:
        x = torch.randn(n, in_f, device="cuda", dtype=dtype)
        reference = None
        for variant in variants:
            fmt, _, backend = variant.partition(":")
            layer = st.nn.SparseLinear.from_dense(dense, sparsity=sparsity, format=fmt, backend=backend or "auto")
            if fmt == "auto":
                layer.prepare([n])  # decided and built before timing (eager calls would build once repaid)
            fwd, train = fwd_and_train(layer, (x,), list(layer.parameters()))
            out = fwd()
            if reference is None:
                reference = out.float()
            err = ((out.float() - reference).norm() / reference.norm()).item()
            assert err < (2e-2 if dtype == torch.bfloat16 else 1e-4), (variant, err)
            row = {"case": f"{label}, N={n}", "variant": variant, "fwd_ms": bench(fwd)}
            if n > 1:
                row["train_ms"] = bench(train)
            rows.append(row)
            print(row, flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = gcn_rows()
    rows += linear_rows(11008, 4096, 0.9, torch.bfloat16, (1, 512),
                        ("auto", "csr:native", "csr:balanced", "csr:split", "csr:cusparse", "csr:densify", "dense",
                         "bitmap"), "SparseLinear bf16 11008x4096 at 90%")
    rows += linear_rows(4096, 4096, 0.25, torch.float32, (1024,),
                        ("auto", "csr:native", "csr:tiled", "csr:cusparse", "csr:densify", "csr:blocked", "dense"),
                        "SparseLinear fp32 4096x4096 at 25%")
    print("\ncase | default fwd ms | best forced fwd | default / best | default train ms | best forced train | ratio")
    for case in dict.fromkeys(r["case"] for r in rows):
        sel = [r for r in rows if r["case"] == case]
        default = next(r for r in sel if r["variant"] == "auto")
        others = [r for r in sel if r["variant"] != "auto"]
        line = f"{case} | {default['fwd_ms']:.4f}"
        best = min(others, key=lambda r: r["fwd_ms"])
        line += f" | {best['variant']} {best['fwd_ms']:.4f} | {best['fwd_ms'] / default['fwd_ms']:.2f}"
        if "train_ms" in default:
            best_t = min(others, key=lambda r: r["train_ms"])
            line += (f" | {default['train_ms']:.4f} | {best_t['variant']} {best_t['train_ms']:.4f} | "
                     f"{best_t['train_ms'] / default['train_ms']:.2f}")
        print(line)
    write_results(args.out, "layer_routes_cuda.json", run_meta(), rows, results_key="rows")


if __name__ == "__main__":
    main()
