set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
A="tests/test_gluon.py tests/test_gluon_3wg.py tests/test_gluon_persistent_protocol.py tests/test_gluon_sparse.py tests/test_varlen.py tests/test_fast_launch.py tests/test_plans.py tests/test_dropout.py tests/test_persistent_schedule.py tests/test_gluon_grid_order.py tests/test_features.py tests/test_programmable.py"
IGN=""; for f in $A; do IGN="$IGN --ignore=$f"; done
P="timeout -k 5 560 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore -k 'not flex_mods_match and not kernels_compile'"
(CUDA_VISIBLE_DEVICES=0 eval "$P $A" > $OUT/g0.txt 2>&1) &
(CUDA_VISIBLE_DEVICES=1 eval "$P tests/ $IGN" > $OUT/g1.txt 2>&1) &
wait
for f in $OUT/g0.txt $OUT/g1.txt; do grep -E "^(FAILED|ERROR)" $f | head -30; tail -2 $f; done
grep -E "dropout_mask_is_exact|varlen_dropout_matches" $OUT/g0.txt $OUT/g1.txt | head
gzip $OUT/g0.txt $OUT/g1.txt
