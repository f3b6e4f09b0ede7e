"""Where a kernel's warps stall, per SASS instruction, from Nsight Compute's source page.

    ncu --section SourceCounters --section WarpStateStats -k regex:KERNEL --launch-skip 1 --launch-count 1 \
        -o $OUT/rep python3 benchmarks/ncu_cases.py CASE
    ncu --import $OUT/rep.ncu-rep --page source --print-source sass --csv | gzip > sass.csv.gz
    python3 benchmarks/ncu_source_stalls.py sass.csv.gz [--top 25]

Stall samples are grouped by how often an instruction ran: in a warp-specialized kernel the counts tell the roles
apart (instructions run once per warp are the idle / prologue code of every warp, per-tile ones the loops, and the
loader's loop runs a different number of times from the consumers'). Each group prints its share of all samples and
its stall reasons; then the instructions with the most samples, and those with the most excess shared-memory
wavefronts (bank conflicts).
"""
import argparse
import collections
import csv
import gzip
import io


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        rows = list(csv.reader(io.TextIOWrapper(f, "utf-8")))
    start = next(i for i, row in enumerate(rows) if row and row[0] == "Address")
    header = rows[start]
    return header, [row for row in rows[start + 1:] if len(row) == len(header)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    header, rows = load(args.csv)
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    samples = col["Warp Stall Sampling (All Samples)"]
    total = sum(number(r[samples]) for r in rows) or 1.0
    by_count = collections.defaultdict(list)
    for r in rows:
        by_count[number(r[col["Instructions Executed"]])].append(r)
    print(f"{total:.0f} samples")
    print("runs per instruction: share of samples, top stall reasons (share of the group)")
    for count, group in sorted(by_count.items(), key=lambda kv: -sum(number(r[samples]) for r in kv[1])):
        share = sum(number(r[samples]) for r in group) / total
        if share < 0.01:
            continue
        per = {h: sum(number(r[col[h]]) for r in group) for h in reasons}
        group_total = sum(per.values()) or 1.0
        top = ", ".join(f"{h[6:]} {v / group_total:.0%}" for h, v in sorted(per.items(), key=lambda x: -x[1])[:6])
        print(f"  {count:>12.0f} x ({len(group):4d} instructions): {share:6.1%}  {top}")
    print(f"top {args.top} instructions by samples (share of all; the leading stall reason)")
    for r in sorted(rows, key=lambda r: -number(r[samples]))[:args.top]:
        lead = max(reasons, key=lambda h: number(r[col[h]]))
        runs = r[col["Instructions Executed"]]
        print(f"  {r[0][-6:]} {number(r[samples]) / total:6.1%} {lead[6:]:14} runs {runs:>10}"
              f"  {r[col['Source']].strip()[:70]}")
    if "L1 Wavefronts Shared Excessive" in col:
        excess, waves = col["L1 Wavefronts Shared Excessive"], col["L1 Wavefronts Shared"]
        total_waves = sum(number(r[waves]) for r in rows) or 1.0
        share = sum(number(r[excess]) for r in rows) / total_waves
        print(f"shared-memory wavefronts: {total_waves:.0f}, excess {share:.1%}; the most excess:")
        for r in sorted(rows, key=lambda r: -number(r[excess]))[:8]:
            if number(r[excess]):
                print(f"  {r[0][-6:]} excess {r[excess]:>10} of {r[waves]:>10}  {r[col['Source']].strip()[:70]}")


if __name__ == "__main__":
    main()
