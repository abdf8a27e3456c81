#!/usr/bin/env bash
# A Python 3.12 environment for the peers that need it: MDIO (multidimio 1.2) and Cubed 0.28.
#   bash benchmarks/peer_venv.sh            # makes .venv-peers312 at the repository root
# Then: python benchmarks/segy_ingest.py --mdio-python .venv-peers312/bin/python
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python312="${PYTHON312:-}"
if [ -z "$python312" ]; then  # a pyenv shim may exist and still fail: try it
    if python3.12 -c "" 2>/dev/null; then python312=python3.12
    else python312="$HOME/.pyenv/versions/3.12.1/bin/python"; fi
fi
"$python312" -m venv "$root/.venv-peers312"
"$root/.venv-peers312/bin/pip" install --quiet "multidimio==1.2.3" "cubed==0.28.0" \
    "cubed-xarray>=0.0.9" segyio
"$root/.venv-peers312/bin/pip" install --quiet -e "$root"  # peers.py imports the package
echo "peers environment: $root/.venv-peers312/bin/python"
