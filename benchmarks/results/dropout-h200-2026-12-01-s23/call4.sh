#!/usr/bin/env bash
# Session 23, device call 4: the feature-cost bench (gpu_session.sh features' command, dropout only) on the final tree.
PYTHONPATH=src timeout 400 python3 -m flashtile.bench --head-dims 64,128 --seqlens 8k --causal both \
    --max-seqlen-probe 0 --providers flashtile --feature none --feature dropout:0.1 --out "$OUT/features" \
    > "$OUT/features.log" 2>&1
echo "rc $? elapsed $SECONDS s"
tail -40 "$OUT/features.log"
