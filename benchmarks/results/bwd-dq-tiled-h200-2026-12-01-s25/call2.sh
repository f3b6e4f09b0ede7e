#!/bin/bash
# Session 25 call 2: as call 1, after the preprocess's zeroing and the dQ conversion read the tiled buffer in
# contiguous 64-row pieces (call 1 addressed it element by element). Variant names as at bbbe9c2's parent tree.
export PYTHONPATH=src
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
timeout 240 python -m pytest -q -n 12 --dist worksteal tests/test_gluon_bwd.py -k "tiled or dq_reduce or zeroes_dq" 2>&1 | tail -4
for order in default,dq-tiled dq-tiled,default; do
  timeout 170 python benchmarks/gluon_bwd_check.py --phase bench --variants $order --bench-dims 128 \
    --seqlens 1024,2048,4096,8192,16384 --skip-portable 2>&1 | grep -v "^INFO"
done
timeout 150 python benchmarks/gluon_bwd_check.py --phase bench --bench-dims 64 --seqlens 1024,4096,16384 \
  --variants d64-bm128,d64-bm128-tiled,d64-bm128-split,d64-bm128-split-tiled --skip-portable 2>&1 | grep -v "^INFO"
