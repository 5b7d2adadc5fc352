#!/usr/bin/env bash
# One device run for the decode kernel: its GPU tests (parallel, compile-bound), the tuning sweeps and
# host-cost comparison of `bench/bench_decode.py --tune`, or the decode benchmark. Usage on the GPU machine:
#   bash scripts/decode_tune.sh [tests] [tune] [bench] [quick]
# Logs go to $OUT when it is set (the device tool brings them back), else /tmp/triton_swa_out.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests tune)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
status=0
for step in "${steps[@]}"; do
  t0=$SECONDS
  case "$step" in
    tests)
      timeout "${TESTS_S:-75}" python3 -m pytest tests/ops/test_decode.py -q -p no:cacheprovider -n "${JOBS:-14}" \
        2>&1 | tee "$out/decode-tests.log" | grep -v "^\.\.\.\|warnings\|Deprecat\|scope.set_attr\|^$" | tail -25
      status=$(( status || PIPESTATUS[0] )) ;;
    tune)
      timeout "${TUNE_S:-115}" python3 bench/bench_decode.py --tune --jobs "${JOBS:-14}" 2>&1 \
        | tee "$out/decode-tune.log" | grep "SWEEP\|^    \|HOST\|precompiled\|Error\|total" ;;
    bench)
      # One run per results file: today's decode CSV and log are replaced (copy them back from $OUT).
      gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' _)
      base="bench/results/decode-$(date +%F)-$gpu"
      rm -f "$base.csv"
      timeout "${BENCH_S:-190}" python3 bench/bench_decode.py --budget-s "${BUDGET_S:-150}" 2>&1 \
        | tee "$base.log" | tail -95
      cp "$base.csv" "$base.log" "$out/" 2>/dev/null ;;
    quick)
      timeout 60 python3 bench/bench_decode.py --models g3,g4swa,mistral --batch 1 --ctx 4k --pages 1 --no-flex \
        2>&1 | tail -8 ;;
  esac
  echo "== $step: $(( SECONDS - t0 )) s"
done
exit $status
