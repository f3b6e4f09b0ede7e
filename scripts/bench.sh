#!/usr/bin/env bash
# The main job: sets up .venv if needed, then runs the benchmark command (arguments are passed on).
source "$(dirname "$0")/env.sh"
python -m flashtile.bench "$@"
