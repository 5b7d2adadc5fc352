#!/usr/bin/env bash
# The one GPU entry point: what a device call runs on a machine with CUDA torch and triton (the lent
# H200), from the tree, installing nothing but the wheels it is given. Logs and CSVs go to $OUT.
#
#   bash scripts/gpu.sh tests SHA      the GPU suite (-n 14), then the soak
#   bash scripts/gpu.sh bench SHA      `triton-swa bench` over its default grid against every peer found:
#                                      decode, then prefill and verify (extra arguments go to both runs)
#   bash scripts/gpu.sh hostcost SHA   the step path's host cost (`triton-swa bench --op step`, extra arguments
#                                      go to it) of this tree with FlashInfer's rows, then this tree beside
#                                      .ab/before when it is there (`--compare before=.ab/before`, the A/B)
#   bash scripts/gpu.sh ab SHA         the ops' same-run A/B: triton_swa of this tree beside .ab/before's
#                                      (`triton-swa bench --quick --op decode,prefill,verify,indices --compare`)
#   bash scripts/gpu.sh sglang SHA     SGLang's whole Triton backend beside ours on SGLang's pools
#                                      (`triton-swa bench --op sglang_backend`; needs .whl/sglang)
#   bash scripts/gpu.sh demo SHA       the demo's gpu preset (needs transformers: .whl/demo)
#   bash scripts/gpu.sh engine SHA     SGLang's own Engine on this GPU, per attention backend: the tokens against
#                                      transformers' generate() and the backends against each other, speculative
#                                      algorithms, speed under load (python -m triton_swa.benchmark.serve; extra
#                                      arguments go to it; needs .whl/sglang from scripts/carry_sglang_wheels.sh)
#   bash scripts/gpu.sh load SHA       the load-and-fault scenario on SGLang's launch_server over HTTP (issue 37):
#                                      tiny float32 Gemma 3 and Gemma 4 (+ STANDALONE), 1000 streaming requests
#                                      from 64 clients, faults, retraction, tokens against transformers, free
#                                      counts at idle (python -m triton_swa.testing.sglang_load; extra arguments
#                                      go to it, e.g. --backend triton for SGLang's own; needs .whl/sglang)
#   bash scripts/gpu.sh vllm SHA       the vLLM tier (tests/integration/test_vllm.py, -n 4) on vLLM 0.32's
#                                      own classes (needs .vllm_slim: scripts/carry_vllm.sh)
#   bash scripts/gpu.sh vllm-engine SHA  vLLM's own engine (vllm.LLM) on this GPU, TRITON_SWA beside TRITON_ATTN: tokens
#                                      against transformers' generate(), CUDA graphs and eager, a small speed phase
#                                      (python -m triton_swa.benchmark.vllm_serve; extra arguments go to it). vLLM
#                                      comes in parts, one per call of the held machine (.whl/vllm_engine/callN from
#                                      scripts/carry_vllm_engine.sh): a call short of parts stores its part and says
#                                      which to carry next; the call that completes them installs and runs
#   bash scripts/gpu.sh profile SHA    where a decode, prefill or verify case's GPU time goes (default: the wide-head
#                                      decodes; --case ID ... for others): the split sweep (--tile BMxBNxWxS ...:
#                                      those extend tiles instead) and the time by kernel
#                                      (python -m triton_swa.benchmark.splits), then each case's default calls
#                                      under Nsight Compute (ncu) where the machine has it (PROFILE_NCU=0: not)
#   bash scripts/gpu.sh all SHA        tests, bench, hostcost, in that order
#   bash scripts/gpu.sh verify SHA     tests with the vllm tier beside them, then the step's host cost beside
#                                      .ab/before without FlashInfer (2 rounds; AB_ROUNDS): one call (about
#                                      500 s) carrying .whl/sglang, .vllm_slim and .ab (under the carry limit)
#
# Carry what a mode needs (the device copies the tree, not git-ignored folders): .whl (SGLang's wheels
# from scripts/carry_sglang_wheels.sh, transformers in .whl/demo) for tests, bench, sglang and demo; .peers
# (scripts/fetch_peers.sh: vLLM's Triton attention, FlashInfer) for bench and hostcost; .ab (an old
# tree in .ab/before: git archive OLD | tar -x -C .ab/before) for the A/B. .whl and .peers together
# exceed the carry limit: run bench and hostcost in one call, tests in another. .vllm_slim (vLLM's
# import closure, about 26 MB) for vllm.
# Left to CI (CPU): the compile tier (tests/compile) and the real-engine tier (tests/engine).
#
# SHA is the commit measured: the device copy carries no .git.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
what=${1:?usage: scripts/gpu.sh tests|bench|hostcost|ab|sglang|demo|engine|load|vllm|vllm-engine|profile|all|verify SHA [args]}
sha=${2:?pass the git sha (the device copy has no .git)}
shift 2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

install_wheels() {
  local carried=()
  for d in .whl/sglang .whl/demo; do [ -d "$d" ] && carried+=("$d"); done
  [ ${#carried[@]} -eq 0 ] || install_carried_wheels "${carried[@]}"
  # none carried this call: what an earlier call of this held machine installed
  [ ${#carried[@]} -gt 0 ] || ! [ -f /tmp/site/.carried ] || install_carried_wheels
}

tests() {
  install_wheels || return 1
  local t0=$SECONDS status
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
  echo "left out: the compile tier (tests/compile) and the real-engine tier (tests/engine): CPU work, run by CI"
  echo "== tests: $(tail -1 "$out/gpu-tests.log")"
  return $status
}

bench_run() {  # bench_run NAME TIMEOUT ARGS...: one triton-swa bench run into $out
  local name=$1 limit=$2 status
  shift 2
  timeout "$limit" python3 -m triton_swa bench --git-sha "$sha" --dirty clean --out "$out" "$@" \
    > "$out/bench-$name.log" 2> "$out/bench-$name-stderr.log"
  status=$?
  grep -v "^rows:\|^plot:" "$out/bench-$name.log" | cut -c1-400
  grep -v "^\[" "$out/bench-$name-stderr.log" | tail -3
  echo "== bench $name exit $status"
  return $status
}

bench() {
  install_wheels >/dev/null 2>&1 || echo "no carried wheels: SGLang's Triton peer skips"
  # each run's own --time-limit stops it 20 s before its timeout, so the rows it measured are written
  # (the pairs left recorded NOT RUN). FlashInfer's first JIT build on a fresh machine took 286 s of
  # the decode run's time on an H100 (2026-12-07), module after module; it now runs as one ninja build.
  # On a held machine ~/.cache keeps it for later calls
  local decode=${DECODE_TIMEOUT_S:-330} extend=${EXTEND_TIMEOUT_S:-240}
  bench_run decode "$decode" --op decode --time-limit $((decode - 20)) "$@"
  bench_run extend "$extend" --op prefill,verify --time-limit $((extend - 20)) "$@"
}

hostcost() {  # extra arguments go to the first run (default: the op's own batches and rounds)
  echo "== host cost of $sha"
  timeout "${HOSTCOST_TIMEOUT_S:-300}" python3 -m triton_swa bench --op step --git-sha "$sha" --dirty clean --out "$out" "$@" 2>&1 \
    | tee "$out/host-cost-$sha.log" | grep -v "^ROW"
  if [ -f .ab/before/triton_swa/__init__.py ]; then step_ab; fi
}

ab() {
  [ -f .ab/before/triton_swa/__init__.py ] || { echo "no .ab/before (git archive OLD | tar -x -C .ab/before)"; return 2; }
  bench_run ab "${AB_TIMEOUT_S:-480}" --quick --op decode,prefill,verify,indices --compare before=.ab/before "$@"
}

sglang() {
  install_wheels || echo "the carried wheels did not all install (the op needs SGLang: .whl/sglang)"
  bench_run sglang "${SGLANG_TIMEOUT_S:-540}" --op sglang_backend "$@"
}

demo() {
  install_wheels || echo "the carried wheels did not all install (the demo needs transformers: .whl/demo)"
  timeout "${DEMO_TIMEOUT_S:-420}" python3 -m triton_swa demo --preset gpu --device cuda --plot "$out/demo-$sha.png" "$@" \
    2>&1 | tee "$out/demo-$sha.log" | tail -40
}

engine() {  # engine [serve args]: the engines' logs go to one archive ($out holds at most 8 files);
  # ENGINE_TAG names this run's files, so several engine runs of one call keep theirs apart
  install_wheels || { echo "the carried wheels did not all install (the engine needs .whl/sglang)"; return 1; }
  local logs=/tmp/triton_swa_engine_logs${ENGINE_TAG:+-$ENGINE_TAG} status tag="$sha${ENGINE_TAG:+-$ENGINE_TAG}"
  rm -rf "$logs"; mkdir -p "$logs"
  timeout "${ENGINE_TIMEOUT_S:-570}" python3 -m triton_swa.benchmark.serve --git-sha "$sha" --dirty clean --out "$logs" "$@" 2>&1 \
    | tee "$out/engine-$tag.log"
  status=${PIPESTATUS[0]}
  for f in "$logs"/serve-*.csv "$logs"/serve-*.json; do [ -f "$f" ] && cp "$f" "$out/${ENGINE_TAG:+$ENGINE_TAG-}$(basename "$f")"; done
  tar -czf "$out/engine-logs-$tag.tar.gz" -C "$logs" --exclude='serve-*' . 2>/dev/null
  echo "== engine${ENGINE_TAG:+ $ENGINE_TAG}: exit $status"
  return "$status"
}

load() {  # load [sglang_load args]: the report and the servers' logs (one archive when large; $out holds at most 8 files)
  install_wheels || { echo "the carried wheels did not all install (the server needs .whl/sglang)"; return 1; }
  local logs=/tmp/triton_swa_load_logs status
  rm -rf "$logs"; mkdir -p "$logs"
  timeout -k 30 "${LOAD_TIMEOUT_S:-540}" python3 -m triton_swa.testing.sglang_load --device cuda --families gemma3,gemma4 \
    --requests 1000 --concurrency 64 --git-sha "$sha" --out "$logs" "$@" 2>&1 | tee "$out/load-$sha.log"
  status=${PIPESTATUS[0]}
  cp "$logs"/load-report.json "$out/load-report-$sha.json" 2>/dev/null
  if [ "$(du -sk "$logs" | cut -f1)" -gt 2048 ]; then
    tar -czf "$out/load-logs-$sha.tar.gz" -C "$logs" --exclude=load-report.json .
  else
    tar -cf "$out/load-logs-$sha.tar" -C "$logs" --exclude=load-report.json .
  fi
  echo "== load: exit $status"
  return "$status"
}

vllm() {
  if [ ! -d .vllm_slim/vllm ] || ! compgen -G ".vllm_slim/wheels/*.whl" >/dev/null; then
    echo "no .vllm_slim (bash scripts/carry_vllm.sh, then carry .vllm_slim)"
    return 2
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/vllm_site .vllm_slim/wheels/*.whl \
    || { echo "unpacking .vllm_slim/wheels failed (made for another python? see .vllm_slim/CARRY_VLLM.txt)"; return 1; }
  [ -d /tmp/triton_swa_meta ] || python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
    --target /tmp/triton_swa_meta . >/dev/null 2>&1 || echo "no triton-swa metadata (the entry-point test will fail)"
  # no vLLM metadata is carried, so vLLM's platform detection would find none: CpuPlatform, as on the
  # CPU tier (CudaPlatform imports the compiled vllm._C_stable_libtorch; scripts/carry_vllm.sh says more)
  export PYTHONPATH="$PYTHONPATH:$PWD/.vllm_slim:/tmp/vllm_site:/tmp/triton_swa_meta" VLLM_TARGET_DEVICE=cpu
  python3 -c 'import torch, triton, vllm, transformers; print("torch", torch.__version__, "triton", triton.__version__, "vllm", vllm.__version__, vllm.__file__, "transformers", transformers.__version__)'
  local t0=$SECONDS status
  echo "git_sha $sha" > "$out/gpu-vllm.log"
  timeout "${VLLM_TIMEOUT_S:-420}" python3 -m pytest tests/integration/test_vllm.py -q -p no:cacheprovider -n 4 -rfEs \
    --durations=5 "$@" >> "$out/gpu-vllm.log" 2>&1
  status=$?
  grep -E "^(FAILED|ERROR|SKIPPED)" "$out/gpu-vllm.log" | cut -c1-300 | head -30
  echo "== vllm tier: $(tail -1 "$out/gpu-vllm.log") ($(( SECONDS - t0 )) s, exit $status)"
  return $status
}

vllm_engine() {  # vllm_engine [vllm_serve args]: gather the carried parts in /tmp, install once, run
  local root=${VLLM_ENGINE_ROOT:-/tmp/vllm_engine} status
  local parts=$root/parts site=$root/site logs=$root/logs meta=$root/triton_swa_meta
  mkdir -p "$parts"
  for d in .whl/vllm_engine/call*; do [ -f "$d/MANIFEST" ] && cp "$d"/vllm_engine.tar.gz.part* "$d/MANIFEST" "$parts/"; done
  [ -f "$parts/MANIFEST" ] || { echo "no part of vLLM here: bash scripts/carry_vllm_engine.sh, then carry .whl/vllm_engine/call1"; return 2; }
  local whole missing=() have=0 n
  n=$(awk '$1 == "parts" {print $2}' "$parts/MANIFEST")
  whole=$(awk '$1 == "whole" {print $2}' "$parts/MANIFEST")
  while read -r kind name sum; do
    [ "$kind" = part ] || continue
    # .whl/vllm_engine/callN holds vllm_engine.tar.gz.part(N-1)
    if [ -f "$parts/$name" ] && [ "$(sha256sum "$parts/$name" | cut -d' ' -f1)" = "$sum" ]; then
      have=$((have + 1))
    else
      missing+=(".whl/vllm_engine/call$(( ${name##*part} + 1 ))")
    fi
  done < "$parts/MANIFEST"
  if [ ${#missing[@]} -gt 0 ]; then
    echo "vllm-engine: $have of $n parts on this machine (in $parts); carry ${missing[*]} in the next call of this held machine"
    return 3
  fi
  if [ "$(cat "$site/.whole" 2>/dev/null)" != "$whole" ]; then
    rm -rf "$root/unpacked" "$site"; mkdir -p "$root/unpacked"
    cat "$parts"/vllm_engine.tar.gz.part* | tar -xz -C "$root/unpacked" || { echo "unpacking the parts failed"; return 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$root"/unpacked/wheels/*.whl \
      || { echo "installing the carried wheels failed (made for another python? see $root/unpacked/CARRY_VLLM_ENGINE.txt)"; return 1; }
    cp "$root/unpacked/vllm/_C_stable_libtorch.abi3.so" "$site/vllm/"
    # FlashAttention's extensions are not carried; vllm.vllm_flash_attn needs one to import (the stand-in says why)
    cp tests/integration/stubs_vllm_cuda/vllm_flash_attn/_vllm_fa2_C.py "$site/vllm/vllm_flash_attn/"
    echo "$whole" > "$site/.whole"
  fi
  # triton-swa's metadata: its vllm.general_plugins entry point (the plugin registers TRITON_SWA)
  [ -d "$meta" ] || python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
    --target "$meta" . >/dev/null 2>&1 || echo "no triton-swa metadata (vLLM will not find the TRITON_SWA plugin)"
  # the carried wheels after the tree; the distribution metadata travels (vLLM's CUDA probe reads it)
  # FlashInfer is not carried: vLLM's sampler imports its backend on CUDA unless told not to (the first
  # start on the H100 stopped there, in topk_topp_sampler.flashinfer_sampler_supported)
  export PYTHONPATH="$PYTHONPATH:$site:$meta" VLLM_PLUGINS=triton_swa VLLM_USE_FLASHINFER_SAMPLER=0
  unset VLLM_TARGET_DEVICE
  python3 -c 'import torch, triton, transformers, vllm, vllm._C_stable_libtorch
n = [o for o in torch._C._dispatch_get_all_op_names() if o.startswith("_C")]
print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__, "vllm", vllm.__version__,
      vllm.__file__, "| _C_stable_libtorch loaded:", len(n), "ops")' || { echo "vLLM or its extension does not import"; return 1; }
  rm -rf "$logs"; mkdir -p "$logs"
  timeout -k 30 "${VLLM_ENGINE_TIMEOUT_S:-560}" python3 -m triton_swa.benchmark.vllm_serve --git-sha "$sha" --dirty clean --out "$logs" "$@" 2>&1 \
    | tee "$out/vllm-engine-$sha.log"
  status=${PIPESTATUS[0]}
  for f in "$logs"/vllm-serve-*.csv "$logs"/vllm-serve-*.json; do [ -f "$f" ] && cp "$f" "$out/"; done
  tar -czf "$out/vllm-engine-logs-$sha.tar.gz" -C "$logs" --exclude='vllm-serve-*' . 2>/dev/null
  echo "== vllm-engine: exit $status"
  return "$status"
}

profile() {  # profile [--case ID ...]: the split sweep of those cases (default: the wide-head decodes), then ncu
  echo "git_sha $sha" > "$out/profile-$sha.log"
  timeout "${PROFILE_TIMEOUT_S:-240}" python3 -m triton_swa.benchmark.splits "$@" 2>&1 | tee -a "$out/profile-$sha.log"
  [ "${PROFILE_NCU:-1}" = 1 ] || { echo "PROFILE_NCU=0: no hardware counters asked for"; return 0; }
  command -v ncu >/dev/null || { echo "no ncu on this machine: no hardware counters"; return 0; }
  local metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum
  metrics+=,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
  metrics+=,launch__grid_size,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem
  local cases=() prev=
  for a in "$@"; do [ "$prev" = --case ] && cases+=("$a"); prev=$a; done
  [ ${#cases[@]} -gt 0 ] || cases=(decode-g4full-B1-L4k-W-1-D512-P1 decode-g4full-B1-L32k-W-1-D512-P1)
  for case in "${cases[@]}"; do
    echo "== ncu: $case (the 5 calls' kernels)"
    timeout 120 ncu --metrics "$metrics" --kernel-name regex:"_swa_(decode|extend|merge)_kernel" --csv --page raw \
      python3 -m triton_swa.benchmark.splits --once "$case" > "$out/ncu-$case-$sha.csv" 2> "$out/ncu-$case-$sha.err"
    echo "ncu exit $?"; tail -3 "$out/ncu-$case-$sha.err"
    python3 - "$out/ncu-$case-$sha.csv" "$metrics" <<'PY' | tee -a "$out/profile-$sha.log"
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if len(rows) < 3:
    print("no ncu rows"); sys.exit()
head, units, rows = rows[0], rows[1], rows[2:]
keep = [head.index(h) for h in ("Kernel Name", "Grid Size", "Block Size", *sys.argv[2].split(",")) if h in head]
print(" | ".join(f"{head[i]} [{units[i]}]" if units[i] else head[i] for i in keep))
for r in rows[-4:]:
    print(" | ".join(r[i] for i in keep))
PY
  done
}

step_ab() {
  [ -f .ab/before/triton_swa/__init__.py ] || { echo "no .ab/before (git archive OLD | tar -x -C .ab/before)"; return 2; }
  echo "== host cost of $sha beside .ab/before"
  timeout "${HOSTCOST_AB_TIMEOUT_S:-200}" python3 -m triton_swa bench --op step --batch 1,64 --verify-batch 1 --rounds "${AB_ROUNDS:-3}" \
    --no-flashinfer --git-sha "$sha" --dirty clean --out "$out" --compare before=.ab/before 2>&1 \
    | tee "$out/host-cost-ab-$sha.log" | sed -n '/side by side/,$p' | grep -v "^ROW"
}

case "$what" in
  tests | bench | hostcost | ab | sglang | demo | engine | load | vllm | profile) "$what" "$@" ;;
  vllm-engine) vllm_engine "$@" ;;
  verify)
    # the vLLM tier beside the suite (its own subshell and environment: it waits on nothing the suite
    # does); the timed A/B after both, alone on the machine
    install_wheels || exit 1
    ( VLLM_TIMEOUT_S=${VLLM_TIMEOUT_S:-300} vllm > "$out/verify-vllm.txt" 2>&1 ) &
    vllm_pid=$!
    TESTS_TIMEOUT_S=${TESTS_TIMEOUT_S:-320} SOAK_TIMEOUT_S=${SOAK_TIMEOUT_S:-90} tests
    status=$?
    wait $vllm_pid || status=1
    cat "$out/verify-vllm.txt"
    AB_ROUNDS=${AB_ROUNDS:-2} step_ab
    exit $status
    ;;
  all)
    tests
    status=$?
    bench "$@"
    hostcost
    exit $status
    ;;
  *)
    echo "unknown: $what (tests, bench, hostcost, ab, sglang, demo, engine, load, vllm, vllm-engine, profile, all, verify)"
    exit 2
    ;;
esac
