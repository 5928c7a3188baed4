"""`tb-gradviz summary`'s block-format table on real fits of the demo's CNN, in float32 and in
mixed_float16: which block formats each layer's gradients survive, as the records say."""

import re

import eventdata
import keras
import pytest
from test_cli import run_cli

from tb_gradviz import GradVizCallback, demos
from tb_gradviz.format import blocks, records

STEPS, BATCH, EVERY = 4, 16, 2
GRADIENTS = ("output_gradient", "input_gradient")


def fit_cnn(log_dir, policy):
    """`demos.small_cnn("max")` for 4 steps under `policy`, every layer logged every 2 steps."""
    keras.utils.set_random_seed(0)
    x, y = demos.pattern_images(STEPS * BATCH, 32, seed=0)
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = demos.small_cnn("max")
        model.compile(
            keras.optimizers.Adam(1e-2),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        callback = GradVizCallback(
            log_dir,
            (x[:BATCH], y[:BATCH]),
            layers=lambda layer: True,
            every_n_batches=EVERY,
            block_formats=True,
        )
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    finally:
        keras.mixed_precision.set_global_policy(previous)
    return callback.chosen_layers


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("block_summary")
    layers = {policy: fit_cnn(root / policy, policy) for policy in ("float32", "mixed_float16")}
    assert layers["float32"] == layers["mixed_float16"]
    return root, layers["float32"]


def table_of(out, run):
    """`{layer: {column: cell}}` of a run's block-format table in `summary`'s output, cut at
    the columns' starts (a cell may hold a space)."""
    section = out.split(f"run {run}  (step {STEPS})", 1)[1].split("\nrun ", 1)[0]
    lines = section.split("\nblock formats  (", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    starts = [match.start() for match in re.finditer(r"-+", lines[1])]
    columns = [lines[0][a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
    table = {}
    for line in lines[2:]:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
        table[cells[0]] = dict(zip(columns, cells))
    return table


def expected_cell(records_of_layer, name):
    """The cell the definition gives (health.md): `ok` when every gradient keeps at most 1 % of
    its non-zero values from becoming zero, else `z` and the largest share that does; then `s`
    and the largest share that saturates when over 1 %."""
    worst = {"to_zero": 0.0, "saturated": 0.0}
    for record in records_of_layer:
        for share in worst:
            count = record["block_formats"][name][share]
            worst[share] = max(worst[share], count / record["finite_nonzero"])
    cell = "ok" if worst["to_zero"] <= 0.01 else f"z{100 * worst['to_zero']:.2f}"
    return cell + (f" s{100 * worst['saturated']:.2f}" if worst["saturated"] > 0.01 else "")


def test_summary_shows_the_block_formats_each_layers_gradients_survive(logdir):
    root, layers = logdir
    status, out, err = run_cli("summary", root, "--details")  # every layer's row
    assert (status, err) == (0, "")
    seen = {}
    for run in ("float32", "mixed_float16"):
        table = table_of(out, run)
        log = eventdata.load(root / run)
        for layer in layers:
            written = [
                records.decode_precision(eventdata.last(log, records.precision_tag(layer, tensor)))
                for tensor in GRADIENTS
                if records.precision_tag(layer, tensor) in eventdata.tensor_tags(log)
            ]
            written = [r for r in written if r["finite_nonzero"]]
            if not written:  # a layer whose gradients are all zero is not in the table
                assert layer not in table
                continue
            row = table[layer]
            assert row["gradients"] == str(len(written))
            for name in blocks.FORMATS:
                assert row[name] == expected_cell(written, name), (run, layer, name)
            seen[(run, layer)] = [name for name in blocks.FORMATS if row[name].startswith("ok")]
    # Both runs say it for every layer with gradients: MXFP8 keeps every layer's gradients,
    # MXFP4 (a value 16 to 32 times below its block's largest is lost) none.
    assert {run for run, _ in seen} == {"float32", "mixed_float16"}
    assert all(
        {"mxfp8_e4m3", "mxfp8_e5m2"} <= set(kept) and "mxfp4_e2m1" not in kept
        for kept in seen.values()
    )
