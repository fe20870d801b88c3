"""The benchmark suites, one module each. A suite is a function ``suite(ctx) -> list of jobs``; a job
builds its inputs, checks every implementation's output against a float64 reference, times it, and
returns rows (see common.py for the byte/flop models and the row format).

To add a suite: a module here with its function, and one line in SUITES below.
"""
from sparsetorch.bench.suites.batched import batched_suite
from sparsetorch.bench.suites.cpu import cpu_suite
from sparsetorch.bench.suites.common import Context, Job, densify_model, gemm_model, measure, spmm_model
from sparsetorch.bench.suites.decode import decode_suite
from sparsetorch.bench.suites.density import density_suite
from sparsetorch.bench.suites.distributed import distributed_suite
from sparsetorch.bench.suites.elementwise import elementwise_suite
from sparsetorch.bench.suites.fresh import fresh_suite
from sparsetorch.bench.suites.gnn import gnn_suite
from sparsetorch.bench.suites.graphs import graph_suite, power_law_graph, random_graph, real_graphs
from sparsetorch.bench.suites.pruned import pruned_suite
from sparsetorch.bench.suites.skew import skew_suite

SUITES = {
    "density": density_suite,
    "graphs": graph_suite,
    "batched": batched_suite,
    "elementwise": elementwise_suite,
    "skew": skew_suite,
    "distributed": distributed_suite,
    "pruned": pruned_suite,
    "decode": decode_suite,
    "gnn": gnn_suite,
    "fresh": fresh_suite,
    "cpu": cpu_suite,
}

__all__ = ["SUITES", "Context", "Job", "densify_model", "gemm_model", "measure", "spmm_model", "power_law_graph",
           "random_graph", "real_graphs"]
