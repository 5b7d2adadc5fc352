#!/usr/bin/env bash
# One device call: this tree's GPU suite with -n 14 (the SGLang and transformers tiers from the carried
# .whl), then `triton-swa bench --quick` (SGLang's Triton decode from the same wheel; FlexAttention in a
# second, smaller run: its compiles take tens of seconds per shape). Logs and CSVs go to $OUT.
#   bash scripts/gpu_final.sh GIT_SHA        (SKIP_TESTS=1: the benchmark only)
set -uo pipefail
sha=${1:?pass the git sha of this tree (the device copy has no .git)}
source "$(dirname "$0")/device_env.sh"
install_carried_wheels .whl/sglang .whl/demo || exit 1
tests=0
if [ -z "${SKIP_TESTS:-}" ]; then
  run_gpu_suite "$sha"
  tests=$?
fi
bench() {
  timeout "$1" python3 -m triton_swa bench --git-sha "$sha" --dirty clean --out "$out" "${@:2}" 2> "$out/bench-stderr.log"
}
bench "${BENCH_TIMEOUT_S:-200}" --quick --providers triton_swa,sglang_triton,gather_sdpa,copy_same_bytes,read_same_bytes > "$out/bench-quick.log"
b1=$?
bench 120 --shape g3 --op decode,prefill --batch 1,64 --pages 1 --providers triton_swa,flex,copy_same_bytes > "$out/bench-flex.log"
b2=$?
grep -v "^rows:\|^plot:" "$out/bench-quick.log" "$out/bench-flex.log" | cut -c1-400
tail -3 "$out/bench-stderr.log"
echo "== bench exit $b1 $b2"
exit $((tests || b1 || b2))
