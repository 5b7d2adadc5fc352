# Sourced by the device scripts: run triton_swa and triton_swa_reference from the tree with the
# machine's python3 (CUDA torch, triton), so nothing needs installing; $out is where logs and CSVs go
# ($OUT when the device tool sets it: it brings them back).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${OUT:-/tmp/triton_swa_out}
mkdir -p "$out"

# install_carried_wheels FOLDER...: the carried wheels (scripts/carry_sglang_wheels.sh, .whl/demo)
# into /tmp/site and triton-swa's own metadata (its sglang.srt.plugins entry point) into
# /tmp/triton_swa_meta, both after the tree on PYTHONPATH; prints the versions it then imports.
install_carried_wheels() {
  local wheels=()
  for d in "$@"; do wheels+=("$d"/*.whl); done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}" \
    || { echo "installing the carried wheels failed"; return 1; }
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/triton_swa_meta . \
    >/dev/null 2>&1 || echo "no triton-swa metadata (the entry-point test will fail)"
  export PYTHONPATH="$PYTHONPATH:/tmp/site:/tmp/triton_swa_meta"
  python3 -c 'import torch, triton, sglang, transformers; print("torch", torch.__version__, "triton", triton.__version__, "sglang", sglang.__version__, "transformers", transformers.__version__)'
}

# run_gpu_suite SHA: the GPU suite with -n 14 (the compile tier is a CPU tier, left to CI; the soak
# runs on its own) into $out/gpu-tests.log; prints the failures and pytest's last line; returns its status.
run_gpu_suite() {
  echo "git_sha $1" > "$out/gpu-tests.log"
  timeout "${TESTS_TIMEOUT_S:-300}" python3 -m pytest tests -q -p no:cacheprovider -n 14 --deselect tests/test_soak.py -m "not compile" -rf \
    >> "$out/gpu-tests.log" 2>&1
  local status=$?
  grep -E "^FAILED|^ERROR" "$out/gpu-tests.log" | head -20
  echo "== tests: $(tail -1 "$out/gpu-tests.log") (exit $status)"
  return $status
}

# run_bench_fp8 SHA [bench/bench_fp8.py args]: the fp8 decode benchmark into $out/fp8-decode-<date>.log
# and its CSV; prints the WRONG lines and the summary; returns its status.
run_bench_fp8() {
  local sha=$1 day
  shift
  day=$(date +%F)
  GIT_SHA=$sha timeout "${FP8_TIMEOUT_S:-280}" python3 bench/bench_fp8.py "$@" > "$out/fp8-decode-$day.log" 2>&1
  local status=$?
  cp bench/results/fp8-decode-"$day"-*.csv "$out"/ 2>/dev/null || true
  grep "^WRONG" "$out/fp8-decode-$day.log" | head
  sed -n '/^== summary/,$p' "$out/fp8-decode-$day.log"
  [ "$status" -eq 0 ] || tail -5 "$out/fp8-decode-$day.log"
  echo "== bench_fp8 exit $status"
  return $status
}
