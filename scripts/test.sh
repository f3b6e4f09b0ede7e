#!/usr/bin/env bash
# The test command: sets up .venv if needed, then runs the CPU tier (Triton interpreter + cpu.py path).
# On a machine with a CUDA GPU the same tests run on the GPU, and `scripts/test.sh -m gpu` runs the GPU tier.
source "$(dirname "$0")/env.sh"
# One pytest worker per CPU (pytest-xdist; FLASHTILE_TEST_WORKERS overrides): the interpreter tier is CPU-bound, and
# 2 workers on CI's 2 cores took it from ~930 s to ~550 s (session 28).
python -m pytest -q -n "${FLASHTILE_TEST_WORKERS:-auto}" "$@"
