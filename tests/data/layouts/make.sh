#!/usr/bin/env bash
# Writes one small logdir per earlier record layout with the code of the
# commit that wrote it, for tests/test_layouts.py. Run from anywhere in the
# checkout; needs TensorFlow. The files are committed: rerun only to add a
# layout (append its commit below), never to change an existing one.
#   1 babdf2f  numpy writer only: 6-field routing records, no loss_scaled/backend/device
#   2 ea6cf0b  the first callback: 7-field routing, no loss_scaled/backend/device
#   3 394d555  tf.distribute and mixed precision: loss_scaled, no backend/device
#   4 a4aadd0  backend and device
#   5 88cce65  units and routing maps, no weights=True
#   6 64c3ecc  weights=True: weight tensors and update records, no digest
#   7 0e16de2  the per-event digest (plugin gradviz_digest), no precision records
#   8 7c73bbe  the precision record per tensor
#   9 be377b1  the digest's precision rows
#  10 feeef3d  the loss-scale record without batches and applied
#  11 a82ce12  the loss-scale record's batches and applied, no block record in precision records
# Layouts 6 to 9 log a conv layer with weights=True too (fit_weights), so
# that what they added is in the files; layout 10 the same fit with a
# LossScaleOptimizer (fit_loss_scale) that skips no step, and layout 11 the same.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(git -C "$here" rev-parse --show-toplevel)"
work="$(mktemp -d)"
trap 'git -C "$repo" worktree prune; rm -rf "$work"' EXIT

fit='
import sys, numpy as np, keras
from tb_gradviz.callback import GradVizCallback
keras.utils.set_random_seed(0)
x = np.random.default_rng(0).normal(size=(8, 8, 8, 1)).astype("float32")
y = np.arange(8) % 2
for pool in ("max", "average"):
    layer = keras.layers.MaxPooling2D if pool == "max" else keras.layers.AveragePooling2D
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, padding="same", activation="relu"),
                              layer(2, name="pool"), keras.layers.Flatten(), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = GradVizCallback(f"{sys.argv[1]}/{pool}", probe_data=(x[:4], y[:4]), every_n_batches=1)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[callback])
'
# Layouts 6 and later: one run, whose conv layer is logged too (a pooling
# layer has no weights), with weights=True, through the import every later
# commit has.
fit_weights='
import sys, numpy as np, keras
from tb_gradviz import GradVizCallback
keras.utils.set_random_seed(0)
x = np.random.default_rng(0).normal(size=(8, 8, 8, 1)).astype("float32")
y = np.arange(8) % 2
model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, padding="same", activation="relu", name="conv"),
                          keras.layers.MaxPooling2D(2, name="pool"), keras.layers.Flatten(), keras.layers.Dense(2)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
callback = GradVizCallback(f"{sys.argv[1]}/max", probe_data=(x[:4], y[:4]), layers=["conv", "pool"],
                           every_n_batches=1, weights=True)
model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[callback])
'
fit_loss_scale="${fit_weights/model.compile(\"sgd\"/model.compile(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=16.0)}"
numpy_writer='
import sys
from tb_gradviz import synthetic
synthetic.write_run(f"{sys.argv[1]}/max", layers=2, steps=2)
'
for entry in "1 babdf2f numpy_writer" "2 ea6cf0b fit" "3 394d555 fit" "4 a4aadd0 fit" "5 88cce65 fit" \
             "6 64c3ecc fit_weights" "7 0e16de2 fit_weights" "8 7c73bbe fit_weights" \
             "9 be377b1 fit_weights" "10 feeef3d fit_loss_scale" "11 a82ce12 fit_loss_scale"; do
  read -r number commit writer <<<"$entry"
  out="$here/layout$number-$commit"
  [ -e "$out" ] && continue
  git -C "$repo" worktree add -q --detach "$work/$commit" "$commit"
  (cd "$work/$commit" && PYTHONPATH="$work/$commit" python3 -c "${!writer}" "$out")
  # A file name holds the writer's host, pid and time; keep them short and fixed.
  for f in $(find "$out" -name 'events.out.tfevents.*'); do mv "$f" "$(dirname "$f")/events.out.tfevents.0000000000.layout.0.0.gradviz"; done
done
