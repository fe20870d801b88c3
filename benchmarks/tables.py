"""Markdown tables from a benchmark JSON written by benchmarks/spmm_cuda.py.

    python benchmarks/tables.py benchmarks/results/h100/spmm_cuda.json > benchmarks/results/h100/README.md
"""
import json
import sys


def main(path):
    d = json.load(open(path))
    meta = d["meta"]
    print(f"# SpMM on {meta['device']} ({meta['date']}, torch {meta['torch']})\n")
    print(f"Measured in the same run: device-to-device copy {meta['copy_bandwidth_GBps']:.0f} GB/s (read + write), "
          f"fp32 GEMM (TF32 off) {meta['fp32_peak_TFLOPs']:.1f} TFLOP/s. Floor = max(bytes / copy bandwidth, "
          "flops / fp32 peak), byte model in benchmarks/spmm_cuda.py. Times are medians of CUDA-event timings; "
          "every output was checked against a float64 reference first. Speedup is against the first row of "
          "each case.\n")
    suite = None
    for r in d["results"]:
        if r["suite"] != suite:
            suite = r["suite"]
            print(f"\n## {suite}\n")
            if "ms" in r:
                print("| case | time (us) | speedup | floor (us) | % of floor | GB/s |")
                print("|---|---:|---:|---:|---:|---:|")
            else:
                print("| call | host time per call (us) |")
                print("|---|---:|")
        if "ms" in r:
            print(f"| {r['case']} | {r['ms'] * 1e3:.1f} | {r['speedup_vs_baseline']:.2f}x | {r['floor_ms'] * 1e3:.1f} "
                  f"| {100 * r['of_floor']:.1f}% | {r['GBps']:.0f} |")
        else:
            print(f"| {r['case']} | {r['us_per_call']:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1])
