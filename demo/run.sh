#!/usr/bin/env bash
# The main job, on a fresh machine: installs tb_gradviz with TensorFlow (CPU),
# trains nine runs with the callback on generated data (small CNNs, two plain
# CNNs, the small CNN in mixed_float16 with and without loss scaling, a
# transformer, a network that diverges and ResNet50; saying which and why
# before each), and serves TensorBoard with the GradViz tab on 127.0.0.1 (the URL is
# printed).
# Arguments go to `tb-gradviz demo`, e.g. --no-serve, --port 6006, --model cnn.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -e ".[cpu]"
exec python3 -m tb_gradviz.cli demo "$@"
