# Sourced by the tier set-up scripts (setup_sglang.sh, setup_sglang_engine.sh, setup_vllm.sh): pinned
# installs with --no-deps into the venv at $PY, pip's log in $LOG. The sourcing script defines
# skip (prints "<tier>: SKIPPED (why)" and exits 0) and fail (prints "<tier>: FAILED (why)", exits 1).

# The pins whose installed version differs (or that are missing), one per line.
missing_pins() {
  "$PY" - "$@" <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version

for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    if have != want:
        print(pin)
PYEOF
}

# pip with short timeouts; on failure, skip when the cause is an unreachable registry.
pip_install() {
  if ! "$PY" -m pip install --no-deps --timeout 30 --retries 2 "$@" >"$LOG" 2>&1; then
    if grep -qiE "NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|Name or service not known|Network is unreachable|Connection refused|Max retries exceeded|Read timed out|ConnectTimeout|ProxyError" "$LOG"; then
      skip "package registry unreachable: pip could not fetch $# package(s)"
    fi
    fail "pip install $*"
  fi
}

# install_pins NAME PIN...: the pins not yet satisfied, announced as "NAME: installing N pinned packages".
install_pins() {
  local name=$1
  shift
  local todo
  mapfile -t todo < <(missing_pins "$@")
  if [ "${#todo[@]}" -gt 0 ]; then
    echo "$name: installing ${#todo[@]} pinned packages (--no-deps)"
    pip_install "${todo[@]}"
  fi
}

# The interpreter tier's own pins, where the venv lacks them: triton 3.6.0 (a CUDA torch's triton is
# kept) and numpy below 2.4 (triton 3.6's interpreter breaks on numpy >= 2.4). torch is never
# installed here: a venv without one skips the tier.
require_torch_triton_numpy() {
  "$PY" -c "import torch" >/dev/null 2>&1 || skip "no torch in $PY; scripts/setup_env.sh installs the CPU torch 2.13.0"
  if ! "$PY" -c "import triton" >/dev/null 2>&1; then
    pip_install triton==3.6.0
  fi
  if ! "$PY" -c "import numpy, sys; sys.exit(int(tuple(map(int, numpy.__version__.split('.')[:2])) >= (2, 4)))" >/dev/null 2>&1; then
    pip_install numpy==2.3.5
  fi
}
