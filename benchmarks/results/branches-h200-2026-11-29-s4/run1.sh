# Session 4, call 1: the three waiting branches (tests on the GPU, then timing against main)
set -u
export PYTHONUNBUFFERED=1
O=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader > $O/gpu.txt
t0=$(date +%s)
run_tests() {  # $1 branch, $2 -k expression, rest: files
    c=$1; k=$2; shift 2
    (cd bisect/$c && PYTHONPATH=src timeout -k 5 200 python3 -m pytest -v -p no:cacheprovider -n 5 -rfE --tb=short \
        -W ignore "$@" -k "$k" > $O/tests-$c.txt 2>&1; echo "rc $?" >> $O/tests-$c.txt)
}
run_tests dropout-rand4x "dropout or philox" tests/test_dropout.py tests/test_features.py tests/test_gpu.py &
run_tests softcap-tanh-approx "softcap" tests/test_features.py tests/test_gpu.py tests/test_attention.py tests/test_varlen.py &
run_tests decode-small-pages "paged or decode or page" tests/test_decode.py tests/test_kvcache.py tests/test_varlen.py &
wait
echo "tests done $(( $(date +%s) - t0 )) s"
for c in dropout-rand4x softcap-tanh-approx decode-small-pages; do echo "== $c"; grep -E "^(FAILED|ERROR)" $O/tests-$c.txt | head -20; tail -2 $O/tests-$c.txt; done
for spec in "main dropout_p=0.1" "dropout-rand4x dropout_p=0.1" "main softcap=30.0" "softcap-tanh-approx softcap=30.0"; do
    set -- $spec
    PYTHONPATH=bisect/$1/src timeout -k 5 100 python3 benchmarks/time_commits.py $1 $2 2>&1 | tee -a $O/time_commits.txt | grep -v Warn
done
echo "timing done $(( $(date +%s) - t0 )) s"
for c in main decode-small-pages; do
    PYTHONPATH=bisect/$c/src timeout -k 5 80 python3 -m flashtile.bench --modes decode --providers flashtile --page-size 16 \
        --cuda-graphs --max-seconds 60 --no-plots --out $O/decode-$c > $O/decode-$c.log 2>&1
    echo "== decode $c"; tail -14 $O/decode-$c.log
done
echo "all done $(( $(date +%s) - t0 )) s"
