#!/usr/bin/env bash
# Installs everything the tests need on a fresh machine, then runs them all.
# Usage: bash tests/run.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's Chromium for the browser tests. Never `playwright install`: it
# downloads a browser build, which these machines cannot do.
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check -e ".[cpu,test]"

export TF_CPP_MIN_LOG_LEVEL=3
exec python3 -m pytest -q "$@"
