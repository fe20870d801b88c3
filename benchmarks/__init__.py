"""sparsetorch's benchmarks: the main job's runner (run.py, ``python -m benchmarks``), its suites
(suites/), timing and checks (harness.py), the report (report.py), standalone scripts, and the results
that were kept (results/<device kind>/). Not part of the installed package: run from the repository root.
"""
