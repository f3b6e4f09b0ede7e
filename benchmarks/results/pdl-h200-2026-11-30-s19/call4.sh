#!/usr/bin/env bash
# Session 19, call 4: decode graphs with PDL (wait + early trigger), PDL wait only, and serial launches, alternated.
export PYTHONUNBUFFERED=1
for r in 1 2; do
  for v in trigger waitonly off; do
    case $v in
      trigger) pp="$PWD/src"; pdl=1 ;;
      waitonly) pp="$PWD/bisect/waitonly/src"; pdl=1 ;;
      off) pp="$PWD/src"; pdl=0 ;;
    esac
    echo "== $v round $r"
    PYTHONPATH=$pp FLASHTILE_PDL=$pdl timeout 80 python3 benchmarks/decode_profile.py --cache-lens 4096,16384 --decode-batch 8 2>&1 | grep graph
  done
done
