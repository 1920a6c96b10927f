#!/usr/bin/env python3
"""Per-kernel table of one decode step from an ncu CSV (scripts/ncu-step.sh writes it).

ncu --csv prints one row per (kernel launch, metric). The launches of one forward pass run from one embed_kernel to
the next; this takes the last complete interval (a decode step when the run ended with decode steps) and prints,
per kernel name and grid size: calls, total and per-call time, bytes read from DRAM per call, the rate, and the
warp instructions issued per 2 KB read (the unit the GEMV notes use). Usage: ncu-step.py FILE.csv
"""
import collections
import csv
import io
import sys


def launches(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [l for l in f.read().split("\n") if l.startswith('"')]
    by_id = collections.OrderedDict()
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        k = by_id.setdefault(row["ID"], {"name": row["Kernel Name"]})
        try:
            k[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
        except ValueError:
            pass
    return list(by_id.values())


def short(name):
    return name.split("(")[0].replace("void ", "")[:44]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ncu-step.py FILE.csv")
    ks = launches(sys.argv[1])
    embeds = [i for i, k in enumerate(ks) if "embed_kernel" in k["name"]]
    if len(embeds) < 2:
        sys.exit("ncu-step: fewer than two forward passes (embed_kernel launches) in the file")
    a, b = embeds[-2], embeds[-1]
    step = ks[a:b]
    total = sum(k.get("gpu__time_duration.sum", 0.0) for k in step) / 1e3
    print(f"launches {a}..{b - 1} of {len(ks)}: {len(step)} kernels, {total:.1f} us of kernel time")
    agg = collections.OrderedDict()
    for k in step:
        e = agg.setdefault((short(k["name"]), int(k.get("launch__grid_size", 0))), [0, 0.0, 0.0, 0.0])
        e[0] += 1
        e[1] += k.get("gpu__time_duration.sum", 0.0) / 1e3
        e[2] += k.get("dram__bytes_read.sum", 0.0)
        e[3] += k.get("smsp__inst_executed.sum", 0.0)
    print(f"{'kernel':44} {'grid':>6} {'calls':>5} {'total us':>9} {'us/call':>8} {'MB/call':>8} {'GB/s':>6}"
          f" {'instr/2KB':>9}")
    for (name, grid), (calls, us, rd, ins) in sorted(agg.items(), key=lambda x: -x[1][1]):
        rate = rd / us / 1e3 if us else 0.0
        per2k = ins / (rd / 2048) if rd else 0.0
        print(f"{name:44} {grid:6d} {calls:5d} {us:9.1f} {us / calls:8.2f} {rd / calls / 1e6:8.2f} {rate:6.0f}"
              f" {per2k:9.0f}")


if __name__ == "__main__":
    main()
