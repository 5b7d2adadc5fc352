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
# The same wheels again on a held machine (/tmp stays between its calls) install nothing; no folder
# at all uses what an earlier call installed.
install_carried_wheels() {
  local wheels=() stamp
  for d in "$@"; do wheels+=("$d"/*.whl); done
  stamp=$(ls "${wheels[@]}" 2>/dev/null | xargs -r -n1 basename | sort | sha1sum | cut -c1-16)
  if [ ${#wheels[@]} -gt 0 ] && [ "$(cat /tmp/site/.carried 2>/dev/null)" != "$stamp" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}" \
      || { echo "installing the carried wheels failed"; return 1; }
    echo "$stamp" > /tmp/site/.carried
  fi
  [ -d /tmp/triton_swa_meta ] || python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
    --target /tmp/triton_swa_meta . >/dev/null 2>&1 || echo "no triton-swa metadata (the entry-point test will fail)"
  export PYTHONPATH="$PYTHONPATH:/tmp/site:/tmp/triton_swa_meta"
  python3 -c 'import torch, triton, sglang, transformers; print("torch", torch.__version__, "triton", triton.__version__, "sglang", sglang.__version__, "transformers", transformers.__version__)'
}
