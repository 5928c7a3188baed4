#!/usr/bin/env bash
# What installing each backend adds to a machine (and to CI): wall time and
# site-packages size, each into a fresh venv, as tests/run.sh installs them.
# Usage: bash bench/bench_install.sh [JSON_PATH]
set -euo pipefail
out=${1:-}
rows=()
for spec in "torch==2.13.0" "jax>=0.4.30" "tensorflow-cpu>=2.16"; do
  venv=$(mktemp -d)
  python3 -m venv "$venv"
  start=$(date +%s.%N)
  "$venv/bin/pip" install -q --disable-pip-version-check "$spec" >/dev/null 2>&1
  end=$(date +%s.%N)
  mb=$(du -sm "$venv/lib" | cut -f1)
  seconds=$(python3 -c "print(round($end - $start, 1))")
  echo "RESULT {'package': '$spec', 'install_s': $seconds, 'venv_lib_mb': $mb}"
  rows+=("{\"package\": \"$spec\", \"install_s\": $seconds, \"venv_lib_mb\": $mb}")
  rm -rf "$venv"
done
if [ -n "$out" ]; then
  (IFS=,; echo "{\"script\": \"bench_install\", \"date\": \"$(date -u +%F)\", \"rows\": [${rows[*]}]}") > "$out"
fi
