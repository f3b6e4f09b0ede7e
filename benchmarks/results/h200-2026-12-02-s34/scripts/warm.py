"""Compile (not time) what `gluon_check.py --phase bench-features` will run: gluon_check's timer replaced by one call.
    python3 bisect/s31/warm.py DIM VARIANT[,VARIANT]   (several in parallel fill the triton cache on many CPUs)"""
import sys

sys.path.insert(0, "benchmarks")
import gluon_check  # noqa: E402

gluon_check._ms = lambda fn: (fn(), 1.0)[1]
gluon_check.phase_bench_features(sys.argv[2].split(","), [int(sys.argv[1])])
