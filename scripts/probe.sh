#!/usr/bin/env bash
# One exploratory device run (the questions behind a heuristic change), in timed steps:
#   bash scripts/probe.sh [backend] [extend-tests] [decode] [extend] [extend-quick]
# backend: the backend's GPU tests (page-table path, CUDA-graph capture at page sizes 1 and 16);
# extend-tests: the extend kernel's GPU tests (grid, splits, wgmma kept asynchronous);
# decode: bench/probe_decode.py (512-wide heads through CSR, one-tile windows, same-byte copy floor);
# extend: a D 128 tile sweep of the N = 8192 prefill ($EXTEND_CONFIGS, bm:bn:warps:stages:pack);
# extend-quick: bench_extend.py --quick (N = 8192 prefill against FlexAttention, B 64 verify).
# Logs go to $OUT (the device tool brings them back).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(backend decode extend)
status=0
for step in "${steps[@]}"; do
  t0=$SECONDS
  case "$step" in
    backend)
      timeout 170 python3 -m pytest tests/test_backend.py -q -p no:cacheprovider -n 8 2>&1 \
        | tee "$out/backend-tests.log" | tail -4
      status=$(( status || PIPESTATUS[0] )) ;;
    extend-tests)
      timeout "${TESTS_S:-240}" python3 -m pytest tests/ops/test_extend.py -q -p no:cacheprovider -n 8 2>&1 \
        | tee "$out/extend-tests.log" | tail -4
      status=$(( status || PIPESTATUS[0] )) ;;
    decode)
      timeout "${DECODE_S:-240}" python3 bench/probe_decode.py ${DECODE_STEPS:-d512 short floor} 2>&1 \
        | tee "$out/probe-decode.log" | grep -v "^  \|Warning\|warn" ;;
    extend)
      cfgs=${EXTEND_CONFIGS:-64:64:4:3:4,64:128:4:3:4,64:64:4:4:4,64:64:4:2:4,64:32:4:4:4,64:64:4:3:2,64:128:4:2:4,128:128:8:3:2}
      timeout "${EXTEND_S:-150}" python3 bench/bench_extend.py --sweep --sweep-dims 128 --sweep-configs "$cfgs" 2>&1 \
        | tee "$out/extend-sweep.log" | grep "D=\|default\|ceiling" ;;
    extend-quick)
      timeout "${QUICK_S:-240}" python3 bench/bench_extend.py --quick 2>&1 | tee "$out/extend-quick.log" | tail -14
      cp bench/results/extend-*.csv "$out/" 2>/dev/null ;;
  esac
  echo "== $step: $(( SECONDS - t0 )) s"
done
exit $status
