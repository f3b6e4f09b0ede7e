"""Per tensor of fuzz cases, max error / the bound of DESIGN's rule (tests/fuzz_cases.check with the asserts
recording instead of raising), for one library version (whichever flashtile PYTHONPATH finds first).
    PYTHONPATH=<src>:tests python3 fuzz_ratios.py LABEL SEED..."""
import sys

import torch

import fuzz_cases
import utils

rows = []


def record(name, got, ref64, ref_lowp, dtype, shift=None, slack=None):
    diff = (got.double() - (ref64 if shift is None else ref64 + shift)).abs()
    err = (diff if slack is None else (diff - slack).clamp(min=0.0)).max().item()
    bound = 2 * utils.max_err(ref_lowp, ref64) + utils.max_err(ref64.to(dtype), ref64) + utils.ABS_FLOOR[dtype]
    rows.append(f"{name} {err / bound:.2f}x (err {err:.3g}, max|ref| {ref64.abs().max().item():.3g})")


fuzz_cases.assert_close_rule = record
label = sys.argv[1]
for seed in map(int, sys.argv[2:]):
    case = fuzz_cases.draw(seed, torch.cuda.is_available())
    rows.clear()
    fuzz_cases.check(case, "cuda" if torch.cuda.is_available() else "cpu")
    print(f"{label} {case.name()}: " + ", ".join(rows), flush=True)
