"""The benchmark suites, one module each. A suite is a function ``suite(ctx) -> list of jobs`` (``ctx``: a
common.Context); a job builds its inputs, checks every implementation's output against a float64
reference, times it (benchmarks/harness.py), and returns rows (see common.py for the byte/flop models and
the row format). The runner (benchmarks/run.py) lists the suites in its SUITES table, one line each.
"""
