#!/bin/bash
# Session 26 call 2: the failing D64 sink test in full, a per-variant diagnosis, then test_gluon_bwd.py whole with
# D256's default on the tiled buffer.
export PYTHONPATH=src
timeout 120 python -m pytest -q -x tests/test_gluon_bwd.py -k "sink_gradient and 64-1030-full" 2>&1 | grep -E "Error|error|assert|passed|failed" | head -20
timeout 200 python bisect/s26/sinkdiag.py 1030,520,1100,1152 d64-bm128-split,d64-bm128,default,dq-rows 2>&1 | grep -v "^INFO"
timeout 250 python -m pytest -q -n 12 --dist worksteal tests/test_gluon_bwd.py 2>&1 | tail -6
