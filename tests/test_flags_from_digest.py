"""The flags and the onset from the per-event digest equal those the full records give, step by
step: on real fits with a NaN injected and with gradients made to vanish at a known step, on a
mixed_float16 fit, and on written runs with dead channels, nested models and a late layer."""

import numpy as np
import pytest
import synthetic
import test_onset

from tb_gradviz.board import onset, snapshot
from tb_gradviz.board.columns import records_columns
from tb_gradviz.cli.logs import open_logdir
from tb_gradviz.format import digest, events, health, metadata, records, summaries


def both_paths(logdir, run):
    """`(layers, series_by_kind, records (steps, columns, listed), digest (steps, columns))`."""
    gradviz, ctx, experiment = open_logdir(str(logdir))
    run_store = gradviz._store(ctx, experiment, run)
    layers = run_store.layers()
    series_by_kind = run_store.series_by_kind(layers)
    found = gradviz._digest_columns(run_store, layers)
    assert found is not None, "the run has a digest"
    found_records, listed = records_columns(layers, series_by_kind)
    return layers, series_by_kind, (*found_records, listed), found


def assert_the_digest_judges_as_the_records(logdir, run, ratio=health.DEFAULT_RATIO):
    """Compares, at every logged step, `/step`'s flags from the records with the digest's;
    returns `{flag: steps raised}` (so that a test can say the comparison was not empty)."""
    layers, series_by_kind, (steps, columns, listed), (digest_steps, digest_cols) = both_paths(
        logdir, run
    )
    assert digest_steps.tolist() == steps.tolist()
    assert [c["layer"] for c in digest_cols] == [c["layer"] for c in columns]
    judged = health.verdicts(digest_cols, ratio)
    raised = {}
    for s, step in enumerate(steps.tolist()):
        body = snapshot.step_body(run, layers, series_by_kind, int(step), ratio)
        reference = int(judged["reference"][s])
        assert body["health"]["reference_layer"] == (
            None if reference < 0 else digest_cols[reference]["layer"]
        ), step
        index = {c["layer"]: i for i, c in enumerate(digest_cols)}
        for layer in body["layers"]:
            # A layer logged later than others is in the body from its first step on.
            i = index[layer["layer"]]
            got = health.flag_entries(digest_cols, judged, i, s, listed(layer["layer"], step))
            assert got == layer["flags"], (step, layer["layer"])
            for flag in got:
                raised.setdefault(flag["flag"], set()).add(int(step))
    from_records = onset.onset_body(run, steps, columns, ratio, listed)
    assert onset.onset_body(run, digest_steps, digest_cols, ratio, listed) == from_records
    return raised


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    root = tmp_path_factory.mktemp("fits")
    test_onset.faulty_run(root / "nan", float("nan"), ["scale", "d2", "logits"])
    test_onset.faulty_run(root / "vanish", 1e-6, ["d1", "scale", "d2", "logits"])
    return root


def test_flags_from_the_digest_equal_the_records_on_a_fit_with_a_nan_injected(fits):
    raised = assert_the_digest_judges_as_the_records(fits / "nan", ".")
    fault = test_onset.FAULT_STEP
    assert raised["nonfinite"] == set(range(fault, test_onset.STEPS + 1))


def test_flags_from_the_digest_equal_the_records_on_a_fit_whose_gradients_vanish(fits):
    raised = assert_the_digest_judges_as_the_records(fits / "vanish", ".")
    assert raised == {"vanishing": set(range(test_onset.FAULT_STEP, test_onset.STEPS + 1))}


@pytest.mark.slow
def test_flags_from_the_digest_equal_the_records_on_an_unscaled_mixed_float16_fit(tmp_path):
    pytest.importorskip("keras")
    from tb_gradviz import demos

    demos.train_mixed_cnn(tmp_path / "unscaled", 1.0, steps=3, log_every=1, verbose=0)
    raised = assert_the_digest_judges_as_the_records(tmp_path / "unscaled", ".")
    assert raised["underflow"] == {1, 2, 3}


def tensor(layer, index, role, values, dtype="float32"):
    content = {
        "layer_index": index,
        "layer_dtype": dtype,
        "role": role,
        "index": 0,
        "shape": [None],
    }
    written = events.tensor_records(
        layer, role, summaries.linear_histogram(values), summaries.stats_vector(values), content
    )
    return written + events.precision_records(
        layer, role, summaries.precision_vector(values), content
    )


def written_run(logdir):
    """Six steps of five layers: `a` (float16) gets dead channels from step 2, a NaN at step 4
    and an underflowing gradient at step 5; `block` is a nested model around `block/inner`,
    whose gradient vanishes from step 3; `late` is logged from step 3 on; `head` is last."""
    rng = np.random.default_rng(0)
    log = events.EventLog(logdir)
    for step in range(1, 7):
        written = []
        activation = rng.normal(size=40)
        activation[3] = np.nan if step == 4 else activation[3]
        gradient = rng.normal(size=40) * (1e-7 if step == 5 else 1.0)
        written += tensor("a", 0, records.ACTIVATION, activation, "float16")
        written += tensor("a", 0, records.OUTPUT_GRADIENT, gradient, "float16")
        written += events.units_records(
            "a",
            records.units_vector([False, step >= 2, step >= 3, False]),
            {"layer_index": 0, "tensor": records.ACTIVATION, "channel_axis": -1},
        )
        for index, name, scale in (
            (1, "block", 1e-9),
            (2, "block/inner", 1e-9 if step >= 3 else 1),
        ):
            written += tensor(name, index, records.OUTPUT_GRADIENT, rng.normal(size=20) * scale)
        if step >= 3:
            written += tensor("late", 3, records.OUTPUT_GRADIENT, rng.normal(size=20))
        written += tensor("head", 4, records.OUTPUT_GRADIENT, rng.normal(size=20))
        log.write(step, written)
    log.close()


def test_flags_from_the_digest_equal_the_records_on_written_runs(tmp_path):
    written_run(tmp_path / "written")
    raised = assert_the_digest_judges_as_the_records(tmp_path / "written", ".")
    assert raised["dead"] == {2, 3, 4, 5, 6} and raised["nonfinite"] == {4}
    assert raised["vanishing"] == {3, 4, 5, 6} and raised["underflow"] == {5}
    synthetic.write_run(tmp_path / "synthetic", layers=3, steps=5)
    assert_the_digest_judges_as_the_records(tmp_path / "synthetic", ".")
    synthetic.write_large_run(tmp_path / "large", layers=4, steps=30)
    assert_the_digest_judges_as_the_records(tmp_path / "large", ".")


def test_check_finds_the_onset_at_a_step_whose_full_records_were_not_kept(tmp_path):
    # The digest of every event, the full records of one in three: a NaN at step 4 is in the
    # digest only, and check and /step say step 4 (the records alone would say 6).
    log = events.EventLog(tmp_path, with_digest=False)
    rng = np.random.default_rng(0)
    for step in range(1, 8):
        activation = rng.normal(size=40)
        activation[0] = np.nan if step >= 4 else activation[0]
        written = tensor("a", 0, records.ACTIVATION, activation)
        written += tensor("a", 0, records.OUTPUT_GRADIENT, rng.normal(size=40))
        written += tensor("b", 1, records.OUTPUT_GRADIENT, rng.normal(size=40))
        log.write(step, (written if step % 3 == 0 else []) + digest.digest_records(written))
    log.close()
    status, onsets, result = test_onset.onsets_of(tmp_path, ".")
    assert (onsets["nonfinite"]["step"], onsets["nonfinite"]["raised_steps"]) == (4, 4)
    assert onsets["nonfinite"]["detail"] == "activation: 1 NaN, 0 Inf"
    # The flags at the last step are the digest's, at its last step (the records' is 6).
    assert result["step"] == 7 and status == 1
    assert [(f["layer"], f["flag"]) for f in result["flags"]] == [("a", "nonfinite")]
    gradviz, ctx, experiment = open_logdir(str(tmp_path))
    body = gradviz.step_impl(ctx, experiment, ".", 4)
    assert [f["flag"] for f in body["layers"][0]["flags"]] == ["nonfinite"]
    assert body["health"]["step"] == 4 and body["step"] == 3
    assert body["layers"][0]["tensors"]["activation"]["step"] == 3  # the records' latest


def test_flags_from_the_digest_equal_the_records_on_a_fit_with_weights_and_a_nan(tmp_path):
    # Weight and weight-gradient tensors and update rows in the digest; the NaN reaches the
    # weights' gradients and, after the update, the weights.
    keras = pytest.importorskip("keras")
    from tb_gradviz import GradVizCallback

    keras.utils.set_random_seed(0)
    scale = test_onset.Scale(name="scale")
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu", name="d1"),
            scale,
            keras.layers.Dense(3, name="logits"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.01), "mse")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(24, 6)).astype("float32")
    y = rng.normal(size=(24, 3)).astype("float32")
    callbacks = [
        test_onset.SetFactorAt(scale, 3, float("nan")),
        GradVizCallback(
            tmp_path,
            (x[:8], y[:8]),
            layers=["d1", "scale", "logits"],
            every_n_batches=1,
            weights=True,
        ),
    ]
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=callbacks)
    raised = assert_the_digest_judges_as_the_records(tmp_path, ".")
    assert raised["nonfinite"] == {3, 4, 5, 6}


def test_a_digest_with_a_row_kind_of_a_newer_writer_is_skipped_and_the_records_judged(
    tmp_path, caplog
):
    # A newer tb_gradviz may add a row kind whose length this reader cannot know.
    log = events.EventLog(tmp_path, with_digest=False)
    rng = np.random.default_rng(0)
    for step in (1, 2):
        activation = rng.normal(size=40)
        activation[0] = np.nan if step == 2 else activation[0]
        written = tensor("a", 0, records.ACTIVATION, activation)
        ((tag, vector, summary_metadata),) = digest.digest_records(written)
        rows = [["tensor", "a", "activation"], ["future", "a", "activation"]]
        future = metadata.create_summary_metadata(
            {"kind": "digest", "rows": rows}, plugin_name=digest.PLUGIN_NAME
        )
        log.write(step, written + [(digest.digest_tag(rows), np.append(vector, 1.0), future)])
    log.close()
    gradviz, ctx, experiment = open_logdir(str(tmp_path))
    assert gradviz._store(ctx, experiment, ".").digests() == {}
    assert "digest rows of an unknown kind" in caplog.text
    (found,) = gradviz.onset_impl(ctx, experiment, ".")["onsets"]
    assert (found["flag"], found["step"]) == ("nonfinite", 2)
