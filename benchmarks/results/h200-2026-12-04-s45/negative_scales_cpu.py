# Session 45: every GPU-sized fuzz draw with a negative softmax scale and a backward, run on cpu.py (the rule with
# |scale| in the design slack). Usage: TRITON_INTERPRET=0 PYTHONPATH=src python <this> FIRST END
import sys, torch
sys.path.insert(0, "tests")
import fuzz_cases, fuzz_programmable
lo, hi = int(sys.argv[1]), int(sys.argv[2])
for seed in range(lo, hi):
    for fam, case in (("dense", fuzz_cases.draw(seed, True)), ("mods", fuzz_cases.Case(**fuzz_programmable.draw(seed, True)))):
        if case.softmax_scale is None or case.softmax_scale >= 0 or not case.backward:
            continue
        try:
            fuzz_cases.check(case, "cpu"); r = "passed"
        except AssertionError as e:
            r = f"FAILED {e}"
        print(seed, fam, case.dtype, r, flush=True)
