set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout 300 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore \
  tests/test_gluon_bwd.py tests/test_dropout.py tests/test_varlen.py tests/test_gluon_alibi_split.py tests/test_features.py \
  -k "not flex_mods_match and not kernels_compile" > $OUT/tests.txt 2>&1; echo "tests rc $?"
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -20; tail -1 $OUT/tests.txt
gzip $OUT/tests.txt
timeout 200 bash benchmarks/gpu_session.sh features > $OUT/features-call.log 2>&1; echo "features rc $?"
tail -22 $OUT/features-call.log
