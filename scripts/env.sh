# Sourced by scripts/*.sh: create .venv on first use and install flashtile with what this machine needs.
# Without a GPU it installs the CPU build of torch first (a plain `torch` requirement pulls a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
. .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        python -m pip install -q torch
    else
        python -m pip install -q torch==2.13.0 || python -m pip install -q torch
    fi
fi
if ! python -c "import flashtile, pytest, tqdm, xdist" 2>/dev/null; then
    python -m pip install -q -e ".[test,bench]"
fi
