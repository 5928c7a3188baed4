"""`tb-gradviz summary` on a run longer than a screen: it fits one by default, `--details` prints
every row."""

import re

import numpy as np
import pytest
from test_cli import run_cli

from tb_gradviz.cli import summary

DEPTH = 30
# Each Dense layer's rows: activation, both gradients, and with weights=True its kernel, bias and
# their gradients.
ROWS_PER_LAYER = 7


@pytest.fixture(scope="module")
def deep_run(tmp_path_factory):
    """A real run of 30 sigmoid Dense layers, every layer and its weights logged: hundreds of rows,
    and a gradient that vanishes toward the input (flags on the first layers)."""
    keras = pytest.importorskip("keras")
    from tb_gradviz import GradVizCallback

    root = tmp_path_factory.mktemp("deep")
    keras.utils.set_random_seed(0)
    stack = [keras.Input((8,))]
    stack += [keras.layers.Dense(8, activation="sigmoid", name=f"d{i:02d}") for i in range(DEPTH)]
    model = keras.Sequential(stack + [keras.layers.Dense(1, name="out")])
    model.compile("sgd", "mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 8)).astype("float32"), rng.normal(size=(16, 1)).astype("float32")
    callback = GradVizCallback(
        root / "deep",
        (x[:8], y[:8]),
        layers=lambda layer: True,
        every_n_batches=1,
        weights=True,
        block_formats=True,
    )
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    return root


def layer_rows(text):
    """The rows of the layer table (the first table) of a one-run summary."""
    rows = []
    for line in text.splitlines()[3:]:
        if not line or line.startswith("... "):
            break
        rows.append(line)
    return rows


def test_summary_of_a_run_of_hundreds_of_rows_fits_a_screen_and_keeps_its_flagged_rows(deep_run):
    # The demo's summary printed 1,816 lines, plain_relu_bn alone about 900.
    status, out, err = run_cli("summary", deep_run)
    assert (status, err) == (0, "")
    lines = out.rstrip("\n").splitlines()
    assert lines[0] == "run deep  (step 2)"
    assert len(lines) <= summary.SCREEN_LINES, out
    left_out = [line for line in lines if line.startswith("... ")]
    # The layer, update, precision and block-format tables each say how many rows they left out.
    assert len(left_out) == 4, left_out
    total = (DEPTH + 1) * ROWS_PER_LAYER
    kept = summary.SHORT_ROWS["layers"]
    assert left_out[0].startswith(f"... {total - kept} of {total} rows left out (kept: the rows ")
    assert all(line.endswith("; --details shows them") for line in left_out)
    shown = layer_rows(out)
    assert len(shown) == kept
    # The flagged rows come first: the gradient vanishes toward the input, the first layers are
    # flagged, and a shortened table keeps them, in model order.
    flagged = [row for row in shown if re.search(r"\bvanishing\b", row)]
    assert flagged and flagged[0].split()[0] == "d00", shown


def test_summary_details_prints_every_row_of_every_table(deep_run):
    status, out, err = run_cli("summary", deep_run, "--details")
    assert (status, err) == (0, "")
    assert "left out" not in out
    assert len(layer_rows(out)) == (DEPTH + 1) * ROWS_PER_LAYER
    short = run_cli("summary", deep_run)[1]
    # Shortened, each kept row is the same line as in the whole table.
    assert set(layer_rows(short)) <= set(layer_rows(out))
