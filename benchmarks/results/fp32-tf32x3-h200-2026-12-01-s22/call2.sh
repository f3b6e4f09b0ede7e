#!/bin/bash
# Session 22, call 2: tf32x3 dots for fp32 with TF32 off, on candidate tiles, against FMA dots, TF32 and SDPA.
# run: bash benchmarks/results/fp32-tf32x3-h200-2026-12-01-s22/call2.sh   (repo root, $OUT set)
export PYTHONPATH=src:benchmarks
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
timeout 540 python3 benchmarks/fp32_tiles.py --candidates --jobs 10 --out "$OUT" > "$OUT/fp32_tiles.log" 2>&1
echo "rc $?"
python3 - "$OUT/fp32_tiles.log" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    if "error" in r:
        print("ERROR", r); continue
    if "precompile_s" in r:
        print(r); continue
    if r.get("mode") == "decode":
        print(f"decode D{r['head_dim']} {r['provider']:22} {r['ms']:8.4f} ms {r['gb_per_s']:7.1f} GB/s err {r['max_err']:.1e}")
    else:
        print(f"D{r['head_dim']:<3} {'causal' if r['causal'] else 'full  '} {r['provider']:28} fwd {r['fwd_ms']:7.3f} "
              f"f+b {r['fwd_bwd_ms']:7.3f} ms  {r['fwd_tflops']:6.1f} / {r['bwd_tflops']:6.1f} TF  err {r['max_err']:.1e}"
              f"  first {r['first_call_s']:.1f}s")
PY
grep -v "^{" "$OUT/fp32_tiles.log" | tail -20
