#!/bin/bash
# Session 26 call 1: D256 tiled dQ buffer (variant dq-tiled) tests and A/B in swapped order; the D64 sink tests.
export PYTHONPATH=src
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
timeout 200 python -m pytest -q -n 12 --dist worksteal tests/test_gluon_bwd.py -k "tiled or sink or zeroes_dq" 2>&1 | tail -4
for order in default,dq-tiled dq-tiled,default; do
  timeout 170 python benchmarks/gluon_bwd_check.py --phase bench --variants $order --bench-dims 256 \
    --seqlens 512,1024,2048,4096,8192,16384 --skip-portable 2>&1 | grep -v "^INFO"
done
