set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
git log --oneline -1 2>/dev/null
timeout 400 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore \
  tests/test_gluon_bwd.py tests/test_gluon.py tests/test_varlen.py tests/test_dropout.py -k "dropout or varlen" > $OUT/tests.txt 2>&1
echo "rc $?"; grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -20; tail -2 $OUT/tests.txt
grep -E "varlen_dropout" $OUT/tests.txt | grep -E "PASSED|FAILED" | head
gzip $OUT/tests.txt
