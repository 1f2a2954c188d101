#!/bin/bash
# one device call, 2026-11-27 session 47: after the last layer's contiguous query input (layer.py)
export PYTHONUNBUFFERED=1 PYTHONPATH=src
M=llama-3.1-8b
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== bench (eager, full vocabulary)"; timeout 110 python3 -m rmfast bench --random-init $M --out $OUT/bench --no-plot --device cuda --dtype bfloat16 --n-candidates 8192 --n-naive 512 --hf-batch 1024 --naive-batch 128 --repeats 2 --check-n 64 --full --compile off 2>&1 | tee $OUT/bench.log | grep -v "^WARN"
echo "== scan set-up profile"; timeout 60 python3 benchmarks/scan_setup_profile.py --model $M --top 45 > $OUT/setup_profile.txt 2>&1; head -3 $OUT/setup_profile.txt
echo "== profile"; timeout 100 python3 benchmarks/gpu_check.py --profile-best-of-n $OUT/profile.txt > $OUT/profile.log 2>&1; grep -A3 "fused q\|scan batches\|measured: triton\|one 16128\|GEMM nvjet" $OUT/profile.txt | head -40
echo "== tests"; timeout 90 python3 -m pytest -q -p no:cacheprovider -x tests/test_gpu.py -n 6 2>&1 | tail -5 | tee $OUT/tests.log
echo "== states in RAM"; TMPDIR=/dev/shm timeout 60 python3 -m rmfast bench --workload states --random-init $M --device cuda --dtype bfloat16 --n-candidates 8192 --batch-size 1024 --repeats 3 --states-modes all --out $OUT/states_ram 2>&1 | tail -8
cd $OUT && tar czf all.tgz * && find . -mindepth 1 ! -name all.tgz ! -name bench.log ! -name setup_profile.txt ! -name profile.txt ! -name tests.log -delete; ls -la $OUT
