#!/usr/bin/env bash
# Session 50 call 3 (the tree of 14deadd): this session's fixes on the H200: the files they touched (the -inf bias /
# score_mod blocks, the -inf sink gradient, second order through the op, torch.func refusals, padded head dims),
# torch.compile's GPU tests (the op's backward now wrapped), then a probe of a -inf sink on the Gluon kernels.
set -uo pipefail
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
mkdir -p $OUT
start=$SECONDS
timeout -k 5 300 python3 -m pytest -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore -q \
    tests/test_features.py tests/test_programmable.py tests/test_validation.py tests/test_attention.py \
    tests/test_compile.py > $OUT/touched.txt 2>&1
echo "touched rc=$? $((SECONDS - start)) s"; tail -3 $OUT/touched.txt; grep -E "^(FAILED|ERROR)" $OUT/touched.txt | head -30
timeout -k 5 120 python3 benchmarks/results/h200-2026-12-05-s50/sink_minus_inf_probe.py > $OUT/sink_probe.txt 2>&1
echo "probe rc=$?"; cat $OUT/sink_probe.txt | cut -c1-400
