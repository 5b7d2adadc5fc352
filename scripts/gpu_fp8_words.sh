#!/usr/bin/env bash
# One device call: the decode tests on the GPU, the fp8 decode benchmark with fp8 V tiles as words
# against as bytes (bench/bench_fp8.py --sweep), then the B 1 and 512-wide paged decode probes
# (bench/probe_decode.py b1 d512p16). Logs and CSVs go to $OUT.
#   bash scripts/gpu_fp8_words.sh GIT_SHA
set -uo pipefail
sha=${1:?pass the git sha of this tree (the device copy has no .git)}
source "$(dirname "$0")/device_env.sh"
python3 -m pytest tests/ops/test_decode.py -q -p no:cacheprovider -n 14 -rf > "$out/gpu-tests-decode-$sha.log" 2>&1
echo "== decode tests: $(tail -1 "$out/gpu-tests-decode-$sha.log")"
grep -E "^FAILED|^ERROR" "$out/gpu-tests-decode-$sha.log" | head
FP8_TIMEOUT_S=240 run_bench_fp8 "$sha" --sweep
echo "git_sha $sha" > "$out/probe-decode-$sha.log"
timeout 200 python3 bench/probe_decode.py b1 d512p16 >> "$out/probe-decode-$sha.log" 2>&1
echo "== probe exit $?"
grep -E "^B1 |^D512|copy ceiling" "$out/probe-decode-$sha.log"
