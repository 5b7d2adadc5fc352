#!/usr/bin/env bash
# One device call: this tree's GPU suite with -n 14 (the SGLang and transformers tiers on cuda, from the
# carried .whl; the compile tier is a CPU tier, left to CI), then the fp8 decode benchmark with its
# tile sweep (bench/bench_fp8.py). Logs and CSVs go to $OUT.
#   bash scripts/gpu_suite_fp8.sh GIT_SHA
set -uo pipefail
sha=${1:?pass the git sha of this tree (the device copy has no .git)}
source "$(dirname "$0")/device_env.sh"
install_carried_wheels .whl/sglang .whl/demo || exit 1
day=$(date +%F)
echo "git_sha $sha" > "$out/gpu-tests.log"
timeout "${TESTS_TIMEOUT_S:-330}" python3 -m pytest tests -q -p no:cacheprovider -n 14 --deselect tests/test_soak.py -m "not compile" -rf \
  >> "$out/gpu-tests.log" 2>&1
tests=$?
grep -E "^FAILED|^ERROR" "$out/gpu-tests.log" | head -20
echo "== tests: $(tail -1 "$out/gpu-tests.log") (exit $tests)"
GIT_SHA=$sha timeout "${FP8_TIMEOUT_S:-200}" python3 bench/bench_fp8.py --sweep > "$out/fp8-decode-$day.log" 2>&1
bench=$?
cp bench/results/fp8-decode-"$day"-*.csv "$out"/ 2>/dev/null || true
grep "^WRONG" "$out/fp8-decode-$day.log" | head
sed -n '/^== summary/,$p' "$out/fp8-decode-$day.log"
[ "$bench" -eq 0 ] || tail -5 "$out/fp8-decode-$day.log"
echo "== bench_fp8 exit $bench"
exit $((tests || bench))
