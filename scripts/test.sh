#!/usr/bin/env bash
# The test command: sets up .venv if needed, then runs the CPU tier (Triton interpreter + cpu.py path).
# On a machine with a CUDA GPU the same tests run on the GPU, and `scripts/test.sh -m gpu` runs the GPU tier.
source "$(dirname "$0")/env.sh"
python -m pytest -q "$@"
