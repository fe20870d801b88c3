"""python -m benchmarks: the main job (benchmarks/run.py)."""
from benchmarks.run import main

main()
