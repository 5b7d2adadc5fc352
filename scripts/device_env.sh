# Sourced by the device scripts: run the package from the tree with the machine's python3 (CUDA torch,
# triton), reference/ exposed as triton_swa_reference through a link, so nothing needs installing;
# $out is where logs and CSVs go ($OUT when the device tool sets it: it brings them back).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
site=/tmp/triton_swa_site
mkdir -p "$site" && ln -sfn "$PWD/reference" "$site/triton_swa_reference"
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${OUT:-/tmp/triton_swa_out}
mkdir -p "$out"
