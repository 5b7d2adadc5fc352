#!/usr/bin/env bash
# One scripted device run: GPU tests, then benchmarks. Usage on the GPU machine:
#   bash scripts/gpu_run.sh [tests|bench|all] [pytest -k expression] [bench script names...]
# Uses the machine's python3 (CUDA torch, triton); the packages run from the tree, so nothing needs
# installing. Logs and CSVs are
# copied to $OUT when it is set (the device tool brings them back).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
what=${1:-all}
filter=${2:-}
shift $(( $# > 2 ? 2 : $# ))
benches=("$@")
[ ${#benches[@]} -eq 0 ] && benches=(indices decode extend step)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  python3 -m pytest tests -q -p no:cacheprovider --durations=15 ${filter:+-k "$filter"} 2>&1 | tee "$out/gpu-tests.log" | tail -25
  status=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  for b in "${benches[@]}"; do
    [ -f "bench/bench_$b.py" ] || continue
    echo "== bench_$b"
    timeout 300 python3 "bench/bench_$b.py" 2>&1 | tee "$out/bench-$b.log" | tail -60
  done
  if [[ " ${benches[*]} " == *" step "* ]]; then
    python3 -m pytest bench/test_metadata_host.py -q -p no:cacheprovider --benchmark-only \
      --benchmark-columns=min,median,max,rounds --benchmark-json="bench/results/metadata-host-$(date +%F).json" 2>&1 | tail -8
  fi
  cp bench/results/*.csv bench/results/*.json "$out/" 2>/dev/null
fi
exit $status
