"""What every CUDA benchmark script shares: its timer (sparsetorch.timing's device events), the run's header
(device, torch, date and the ceilings it measured) and the JSON file next to its text log."""
import json
import os
import time

import torch

from sparsetorch import timing


def bench(fn, l2: str = "flush", budget_ms: float = 100.0) -> float:
    """Median device seconds of ``fn()``: the L2 zeroed before each call (``l2="flush"``, do_bench's rule)
    or read (``"clean"``, as a layer meets it in a model step); about ``budget_ms`` of calls, 5 to 250."""
    return 1e-3 * timing.device_time(fn, l2=l2, budget_ms=budget_ms, max_reps=250, warmup=10)

def run_meta(**measured) -> dict:
    """Device, torch version and date, plus whatever the script measured in the same run."""
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            **measured}


def write_results(out_dir, name: str, meta: dict, results: list, results_key: str = "results", **extra) -> None:
    """{"meta": meta, results_key: results, **extra} as out_dir/name (nothing when out_dir is empty)."""
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump({"meta": meta, results_key: results, **extra}, f, indent=1)


def write_table(out_dir, name: str, lines: list) -> None:
    """The markdown table `lines` printed, and written as out_dir/name when out_dir is set."""
    table = "\n".join(lines)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(table + "\n")
    print(table)


def measure_ceilings(bench, dtypes) -> tuple:
    """(copy bandwidth in bytes/s, {dtype: dense GEMM flop/s}) with the timer `bench` (seconds per call):
    a 256 MB clone and an 8192^3 matmul per dtype, TF32 as the caller set it."""
    x = torch.empty(2**26, device="cuda")
    copy_bw = 2 * x.numel() * 4 / bench(lambda: x.clone())
    del x
    rates = {}
    for dt in dtypes:
        p = torch.randn(8192, 8192, device="cuda", dtype=dt)
        rates[dt] = 2 * 8192**3 / bench(lambda: p @ p)
        del p
    return copy_bw, rates


def ceiling_meta(copy_bw: float, rates: dict, note: str) -> dict:
    return run_meta(copy_GBps=copy_bw / 1e9,
                    gemm_TFLOPs={str(k).replace("torch.", ""): v / 1e12 for k, v in rates.items()}, note=note)

