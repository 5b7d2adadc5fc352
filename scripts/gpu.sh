#!/usr/bin/env bash
# The GPU entry point, for one device call on a machine with CUDA torch and triton (the lent H200):
#
#   bash scripts/gpu.sh tests SHA
#
# tests: the wheels carried in .whl/sglang (scripts/carry_sglang_wheels.sh) and .whl/demo
#   (transformers 5.19) go into /tmp/site when present, then the GPU suite runs with -n 14: every
#   tier that has a GPU path (ops, backend, graphs, pools, SGLang's classes with captured CUDA
#   graphs, transformers, demo). Left out, and said so at the end: the compile tier (CPU work, run by
#   CI), the real-engine tier (SGLang's engine on the CPU, run by CI) and the soak (run last, on its
#   own, while time remains). Logs go to $OUT (gpu-tests.log, gpu-soak.log); the last line is pytest's.
#
# SHA is the commit measured: the device copy carries no .git.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
what=${1:?usage: scripts/gpu.sh tests SHA}
sha=${2:?pass the git sha (the device copy has no .git)}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "$what" in
  tests)
    carried=()
    for d in .whl/sglang .whl/demo; do [ -d "$d" ] && carried+=("$d"); done
    if [ ${#carried[@]} -gt 0 ]; then install_carried_wheels "${carried[@]}" || exit 1; fi
    t0=$SECONDS
    echo "git_sha $sha" > "$out/gpu-tests.log"
    timeout "${TESTS_TIMEOUT_S:-420}" python3 -m pytest tests -q -p no:cacheprovider -n 14 -m "not compile" \
      --ignore=tests/engine --deselect tests/test_soak.py -rfEs --durations=10 >> "$out/gpu-tests.log" 2>&1
    status=$?
    grep -E "^(FAILED|ERROR)" "$out/gpu-tests.log" | head -30
    echo "== skipped, by reason:"
    grep -E "^SKIPPED" "$out/gpu-tests.log" | sed -E 's/^SKIPPED \[([0-9]+)\] [^:]+:[0-9]+: /\1 /' \
      | awk '{n=$1; $1=""; c[$0]+=n} END {for (r in c) printf "%6d %s\n", c[r], substr(r, 1, 150)}' | sort -rn | head -12
    sed -n '/slowest/,/^$/p' "$out/gpu-tests.log" | head -14
    echo "== suite: $(( SECONDS - t0 )) s (exit $status)"
    t0=$SECONDS
    timeout "${SOAK_TIMEOUT_S:-120}" python3 -m pytest tests/test_soak.py -q -p no:cacheprovider -n 4 > "$out/gpu-soak.log" 2>&1
    echo "== soak: $(tail -1 "$out/gpu-soak.log") ($(( SECONDS - t0 )) s)"
    echo "left out: the compile tier (tests/compile, CPU work: CI runs it) and the real-engine tier (tests/engine: SGLang's engine on the CPU: CI runs it)"
    echo "== tests: $(tail -1 "$out/gpu-tests.log")"
    exit $status
    ;;
  *)
    echo "unknown: $what (tests)"
    exit 2
    ;;
esac
