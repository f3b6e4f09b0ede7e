#!/bin/bash
# Session 26 call 3: the persistent forward with three consumers (D64, 192-row tiles): its GPU tests, then an A/B
# against the variants serving D64 now (persistent-tma plain <= 2K, persistent-tma-lpt8 causal <= 4K, d64-3wg
# longer), cuDNN in the same processes; the sink test again.
export PYTHONPATH=src
timeout 150 python -m pytest -q -n 12 --dist worksteal tests/test_gluon_3wg.py tests/test_gluon_bwd.py -k "persistent or sink_gradient" 2>&1 | tail -4
timeout 200 python benchmarks/gluon_check.py --phase bench --bench-dims 64 --seqlens 512,1024,2048,4096,8192 \
  --variants persistent-tma,persistent-3wg-tma,d64-3wg,persistent-tma-lpt8,persistent-3wg-tma-lpt8 2>&1 | grep -v "^INFO"
timeout 150 python benchmarks/gluon_check.py --phase bench --bench-dims 64 --seqlens 1024,2048,4096 \
  --variants persistent-3wg-tma-lpt8,persistent-tma-lpt8,persistent-3wg-tma,persistent-tma 2>&1 | grep -v "^INFO"
