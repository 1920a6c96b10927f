#!/usr/bin/env python3
"""Where a kernel's warps spend their time, per SASS instruction, from ncu's source page (scripts/ncu-gemv.sh,
TSR_NCU_SOURCE=1).

`ncu --import R.ncu-rep --page source --csv --print-source sass` prints, per profiled launch, a "Kernel Name" line,
a header and one row per SASS instruction with its warp-state samples (total and per stall reason) and executed
count. For each launch this prints: its samples and warp instructions, the stall reasons' shares, and the windows of
WINDOW consecutive instructions (by address) holding at least 1.5 % of the samples, each with the instructions
executed per warp there and its three most-sampled instructions. A launch may appear twice in the page (ncu repeats
the table for its two views); repeated ones are skipped. Usage: ncu-source.py FILE.csv [WINDOW, default 100]
"""
import csv
import sys


def launches(path):
    out, cur = [], None
    with open(path, encoding="utf-8", errors="replace") as f:
        for row in csv.reader(f):
            if row and row[0] == "Kernel Name":
                cur = {"name": row[1], "rows": []}
                out.append(cur)
            elif row and row[0] == "Address" and cur is not None:
                cur["header"] = row
            elif cur is not None and "header" in cur and len(row) > 5:
                cur["rows"].append(row)
    return out


def getter(k):
    col = {h: i for i, h in enumerate(k["header"])}

    def get(r, name):
        v = r[col[name]] if col.get(name) is not None and col[name] < len(r) else ""
        return int(v.replace(",", "")) if v.strip() else 0

    return get


def totals(k):
    get = getter(k)
    return sum(get(r, "# Samples") for r in k["rows"]), sum(get(r, "Instructions Executed") for r in k["rows"])


def report(k, window):
    rows, get = k["rows"], getter(k)
    samples, executed = totals(k)
    if samples == 0:
        print(f"{k['name'][:90]}: no samples")
        return
    stalls = [h for h in k["header"] if h.startswith("stall_") and "Not Issued" not in h]
    share = sorted(((sum(get(r, s) for r in rows), s[6:]) for s in stalls), reverse=True)
    print(f"=== {k['name'][:100]}")
    print(f"    {samples} samples, {executed} warp instructions, {len(rows)} instructions in the kernel")
    print("    stalls: " + ", ".join(f"{name} {100 * n / samples:.1f} %" for n, name in share[:8] if n))
    # the kernel's first instruction runs once per warp: its count is the launch's warps
    warps = max(get(rows[0], "Instructions Executed"), 1)
    for a in range(0, len(rows), window):
        seg = rows[a:a + window]
        s = sum(get(r, "# Samples") for r in seg)
        if s < 0.015 * samples:
            continue
        per_warp = sum(get(r, "Instructions Executed") for r in seg) / warps
        top = sorted(seg, key=lambda r: -get(r, "# Samples"))[:3]
        names = "; ".join(f"{r[1].strip()[:40]} ({get(r, '# Samples')})" for r in top)
        print(f"    [{a:5d}, {a + len(seg):5d}) {100 * s / samples:5.1f} % of samples, {per_warp:6.1f} per warp"
              f" | {names}")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    window = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    seen = set()
    for k in launches(sys.argv[1]):
        key = (k["name"], totals(k))
        if key in seen:
            continue
        seen.add(key)
        report(k, window)


if __name__ == "__main__":
    main()
