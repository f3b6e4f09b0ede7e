"""The fuzz's fp32 cases with the dots the H200 runs (tf32x3) and with FMA dots ("ieee", launch._dot_precision
patched): per case and tensor, max error / the bound of DESIGN's rule (tests/fuzz_cases.check), worst first.
    PYTHONPATH=src:tests python3 fp32_dots.py tf32x3|ieee FIRST LAST"""
import sys

import torch

import fuzz_cases
import utils
from flashtile import launch

precision, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if precision == "ieee":
    launch._dot_precision = lambda dtype, arch: "ieee" if dtype == torch.float32 else "tf32"
rows = []


def record(name, got, ref64, ref_lowp, dtype, extra=0.0):
    err, low = utils.max_err(got, ref64), utils.max_err(ref_lowp, ref64)
    bound = 2 * low + utils.max_err(ref64.to(dtype), ref64) + utils.ABS_FLOOR[dtype] + extra
    rows.append((err / bound, name, err, bound, ref64.abs().max().item()))


fuzz_cases.assert_close_rule = record
for seed in range(first, last):
    case = fuzz_cases.draw(seed, True)
    if case.dtype != torch.float32:
        continue
    rows.clear()
    fuzz_cases.check(case, "cuda")
    worst = max(rows)
    print(f"{precision} {worst[0]:.2f} {worst[1]} err {worst[2]:.3g} bound {worst[3]:.3g} max|ref| {worst[4]:.3g} "
          f"{case.name()}", flush=True)
