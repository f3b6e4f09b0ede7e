#!/usr/bin/env bash
# One device call per phase (each fits the 10-minute limit), output under $OUT. From the repo root:
#   bash benchmarks/gpu_session.sh tests 1    # the GPU test tier, part 1: the Gluon forward's files, varlen, the
#                                             # launch paths, dropout, features and programmable attention
#   bash benchmarks/gpu_session.sh tests 2    # part 2: every other file (the whole tier no longer fits one call)
#   bash benchmarks/gpu_session.sh tests both # on a two-GPU machine: part 1 on GPU 0 beside part 2 on GPU 1 (session
#                                             # 17, a fresh machine: 501 / 523 s)
#   bash benchmarks/gpu_session.sh tests ids FILE  # the test ids in FILE, one per line (benchmarks/tier_rest.py
#                                             # writes those an earlier call did not finish)
#   bash benchmarks/gpu_session.sh bench      # the default sweep, all providers (~6 min)
#   bash benchmarks/gpu_session.sh features   # feature cost and window scaling at head dim 128, 8K (~3 min)
#   bash benchmarks/gpu_session.sh varlen     # flash_attn_varlen_func vs the dense call on the same tokens
#   bash benchmarks/gpu_session.sh tune [ARGS]  # tile sweep, e.g. tune --head-dims 256 --seqlen 4096
#   bash benchmarks/gpu_session.sh sparse     # block-sparse vs dense flashtile vs FlexAttention, 16K tokens
#   bash benchmarks/gpu_session.sh decode     # KV-cache decoding, flashtile vs SDPA (~1 min, capped at 4)
#   bash benchmarks/gpu_session.sh ncu REGEX CASE...  # Nsight Compute on the kernels matching REGEX in each
#                                             # benchmarks/ncu_cases.py CASE (~10-20 s each): $OUT/ncu-CASE.txt
set -euo pipefail
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-out}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
phase="${1:-tests}"
shift || true
case "$phase" in
    tests)  # -v streams every name to the log, so a timeout still says what ran. The whole tier (1766 tests) ran
        # past 580 s with 16 workers in session 9 (1761 done), hence two parts, one call each. The two deselected
        # groups are CPU-side checks that CI runs.
        part="${1:-}"
        shift || true
        if [ "$part" = both ]; then  # one call instead of two; each part gets its own GPU and half the CPUs' work
            (CUDA_VISIBLE_DEVICES=0 OUT="$OUT/part1" bash "$0" tests 1 "$@" > "$OUT/part1.log" 2>&1) &
            (CUDA_VISIBLE_DEVICES=1 OUT="$OUT/part2" bash "$0" tests 2 "$@" > "$OUT/part2.log" 2>&1) &
            wait
            tail -n 4 "$OUT/part1.log" "$OUT/part2.log"
            exit 0
        fi
        # Two parts (session 17: 1060 and 1298 tests, 501 / 523 s on a fresh x2 machine; session 21, after fp32's FMA
        # tiles stopped spilling: 1078 / 1308 tests, 246 / 395 s on one fresh H200 each; session 26: 1209 / 1375 tests,
        # 279 / 492 s: session 27 moved test_bench.py and test_gluon_alibi_split.py to part 1, then ~410 / 384 s)
        part1_files="tests/test_gluon_dispatch.py tests/test_gluon_reference.py tests/test_gluon_features.py
            tests/test_gluon_dropout.py tests/test_gluon_varlen.py tests/test_gluon_bias.py tests/test_gluon_3wg.py
            tests/test_gluon_persistent_protocol.py tests/test_gluon_sparse.py tests/test_varlen.py
            tests/test_fast_launch.py tests/test_plans.py tests/test_plans_decode.py tests/test_dropout.py
            tests/test_persistent_schedule.py
            tests/test_gluon_grid_order.py tests/test_features.py tests/test_programmable.py tests/test_bench.py
            tests/test_gluon_alibi_split.py"
        if [ "$part" = ids ]; then  # ids hold spaces and brackets: one argument per line
            [ $# -ge 1 ] || { echo "tests ids FILE: FILE lists test ids, one per line" >&2; exit 2; }
            mapfile -t ids < <(grep -v '^[[:space:]]*$' "$1")
            # pytest with no ids (or an empty one) would collect the whole suite
            [ ${#ids[@]} -gt 0 ] || { echo "no test ids in $1: nothing to run"; exit 0; }
            timeout -k 5 580 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore \
                "${ids[@]}" > "$OUT/gpu-tier.txt" 2>&1 || true
            { grep -E "^(FAILED|ERROR)" "$OUT/gpu-tier.txt" || true; } | head -40; tail -3 "$OUT/gpu-tier.txt"
            exit 0
        fi
        case "$part" in
            1) files="$part1_files" ;;
            2) files="tests/ $(for f in $part1_files; do printf -- '--ignore=%s ' "$f"; done)" ;;
            *) echo "tests 1, tests 2, tests both or tests ids FILE" >&2; exit 2 ;;
        esac
        # shellcheck disable=SC2086  # files is a word list
        # --durations: each part's slowest tests, to rebalance the parts (session 19: part 2 took 549 of its 580 s)
        timeout -k 5 580 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore \
            --durations=40 $files -k "not flex_mods_match and not kernels_compile" "$@" > "$OUT/gpu-tier.txt" 2>&1 || true
        { grep -E "^(FAILED|ERROR)" "$OUT/gpu-tier.txt" || true; } | head -40; tail -3 "$OUT/gpu-tier.txt" ;;
    bench)
        python3 -m flashtile.bench --out "$OUT/h200" "$@" > "$OUT/bench.log" 2>&1; tail -60 "$OUT/bench.log" ;;
    features)  # the cost of each feature over the plain kernel (issue 6: <= 10 % at D128, 8K) and window scaling
        python3 -m flashtile.bench --head-dims 128 --seqlens 8k --causal both --max-seqlen-probe 0 \
            --providers flashtile,sdpa-cudnn --feature none --feature window:256:0 --feature window:1024:0 \
            --feature window:4096:0 --feature softcap:30 --feature alibi --feature dropout:0.1 --feature sink \
            --feature bias --out "$OUT/features" "$@" > "$OUT/features.log" 2>&1; tail -60 "$OUT/features.log" ;;
    varlen)  # the varlen path on the same batch (equal lengths) against the dense one
        python3 -m flashtile.bench --head-dims 64,128 --seqlens 2k,8k --causal both --max-seqlen-probe 0 \
            --providers flashtile,flashtile-varlen --out "$OUT/varlen" "$@" > "$OUT/varlen.log" 2>&1
        tail -40 "$OUT/varlen.log" ;;
    sparse)
        python3 -m flashtile.bench --modes sparse --out "$OUT/sparse" "$@" > "$OUT/sparse.log" 2>&1
        tail -40 "$OUT/sparse.log" ;;
    ncu)  # hardware counters (Firecracker machines; --clock-control none leaves the clocks alone): the second launch
        # of each matching kernel (ncu_cases.py runs its call twice: the first compiles)
        [ $# -ge 2 ] || { echo "ncu REGEX CASE...: see benchmarks/ncu_cases.py for the cases" >&2; exit 2; }
        regex="$1"
        shift
        for case in "$@"; do
            echo "== $case"
            timeout 120 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
                --section Occupancy --section WarpStateStats --section LaunchStats --section InstructionStats \
                --metrics "smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
                -k "regex:$regex" --launch-skip 1 --launch-count 1 python3 benchmarks/ncu_cases.py "$case" \
                > "$OUT/ncu-$case.txt" 2>&1 || true
            grep -E "Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|inst_executed.sum|stalled_(barrier|lg_throttle|long_scoreboard|wait|math_pipe_throttle|mio_throttle|short_scoreboard)_per" \
                "$OUT/ncu-$case.txt" || tail -5 "$OUT/ncu-$case.txt"
        done ;;
    decode)  # records stream to the log and $OUT/decode/decode.jsonl; the budget stops it cleanly
        timeout -k 20 300 python3 -m flashtile.bench --modes decode --providers flashtile,sdpa --max-seconds 240 \
            --no-plots --out "$OUT/decode" "$@" 2>&1 | tee "$OUT/decode.log" | tail -70 ;;
    tune)
        python3 benchmarks/tune.py --out "$OUT/tune.json" "$@" 2>&1 | tee "$OUT/tune.log" | tail -12 ;;
    *)
        echo "unknown phase $phase: tests, bench, features, varlen, sparse, decode, ncu or tune" >&2; exit 2 ;;
esac
