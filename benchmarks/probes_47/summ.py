import json, sys, statistics
for path in sys.argv[1:]:
    rows = json.load(open(path))["rows"]
    cost = [r for r in rows if r["case"].startswith("costliest")]
    firsts = [r["vs_torch_first"] for r in rows if r.get("vs_torch_first")]
    print(path, "within:", sum(r["within_bound"] for r in cost), "of", len(cost),
          "first median vs torch:", round(statistics.median(firsts), 3) if firsts else None)
    for r in cost:
        if not r["within_bound"]:
            print(f"  {r['case']:70s} {r['time_ms']:.3f} ms bound {r['bound_ms']:.3f} rep {r['worst_rep']} call {r['worst_call']}")
    for r in rows:
        if r["case"].startswith("stream"):
            print("  ", r["case"], r["impl"], round(r["time_ms"], 4))
