#!/usr/bin/env bash
# Installs everything the tests need on a fresh machine, then runs them all:
# ruff, the cross-backend tests (CROSS_BACKEND below) on JAX and on PyTorch,
# then the whole suite on Keras' TensorFlow backend.
# Usage: bash tests/run.sh [pytest args]   (with args: one pytest run, on $KERAS_BACKEND)
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's Chromium for the browser tests. Never `playwright install`: it
# downloads a browser build, which a machine without internet access cannot do.
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

# torch==2.13.0: CI's machines hold a CPU build of this version on disk, which
# pip takes (PyPI's Linux torch is the CUDA build, several GB with its NVIDIA
# libraries).
python3 -m pip install -q --disable-pip-version-check -e ".[cpu,jax,remote,test]" "torch==2.13.0"

export TF_CPP_MIN_LOG_LEVEL=3
if [ "$#" -gt 0 ]; then
  exec python3 -m pytest -q "$@"
fi
# Formatting and lint first: a violation fails the run before any test.
python3 -m ruff format --check .
python3 -m ruff check .
CROSS_BACKEND=(tests/test_backends.py tests/test_weights.py tests/test_device_statistics.py
  tests/test_precision_capture.py tests/test_device_blocks.py tests/test_judgement.py tests/test_in_step_backends.py
  tests/test_device_programs.py)
# Every run on two pytest workers (pytest-xdist), each test file whole on one of them (its
# module fixtures built once): one process leaves a core idle while it compiles or runs Python.
# Files in tests/conftest.py's order (the longest first), which --no-loadscope-reorder keeps.
XDIST=(-n 2 --dist loadfile --no-loadscope-reorder)
KERAS_BACKEND=jax python3 -m pytest -q -p no:cacheprovider "${XDIST[@]}" "${CROSS_BACKEND[@]}"
KERAS_BACKEND=torch python3 -m pytest -q -p no:cacheprovider "${XDIST[@]}" "${CROSS_BACKEND[@]}"
# Then the whole suite.
KERAS_BACKEND=tensorflow exec python3 -m pytest -q "${XDIST[@]}" --durations=15
