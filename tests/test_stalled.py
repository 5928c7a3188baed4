"""The stalled-training flags on real fits and by hand: `stalled` and `skipped_steps`.

Three tiny fits on TensorFlow, each of three epochs of 16 batches logged at
each epoch's end with weights=True: one whose learning rate is 0 (its
weights never move: `stalled` from the second log event on), one under
mixed_float16 whose `LossScaleOptimizer` begins at 2**40 and never grows
(the first epoch's steps all overflow and are skipped, half the second's:
`skipped_steps` at the events that saw them, with the share the optimizer's
iterations give), and a healthy one (neither flag). The skipping fit again
logged every 4 optimizer steps: the callback then counts each batch end.
"""

import json

import numpy as np
import pytest
import test_plugin

from tb_gradviz.board import loss_scale
from tb_gradviz.capture import loss_scale as capture_loss_scale
from tb_gradviz.format import health, rule_columns, stalled

BATCHES, EPOCHS = 16, 3
# The loss-scale record's fields before it counted batches.
FIELDS_WITHOUT_BATCHES = ["loss_scale", "growth_counter", "growth_steps", "initial_scale"]


def fit(log_dir, name):
    """Fits one run; returns the optimizer's iterations at each epoch's end (each log event
    logged by epoch), or `(batches seen, iterations)` at each batch end (`by_batch`)."""
    import keras

    import tb_gradviz

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4 * BATCHES, 8)).astype("float32")
    y = rng.integers(0, 3, size=len(x))
    iterations = []

    def record(*_, **__):
        iterations.append(int(keras.ops.convert_to_numpy(model.optimizer.iterations)))

    if name == "by_batch":
        recorder = keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: (
                record(),
                iterations.append(len(iterations) // 2 + 1),
            )
        )
    else:
        recorder = keras.callbacks.LambdaCallback(on_epoch_end=record)
    policy = "float32" if name == "lr0" else "mixed_float16"
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(8, activation="relu", name="hidden"),
                keras.layers.Dense(3, dtype="float32", name="head"),
            ]
        )
        if name == "lr0":
            optimizer = keras.optimizers.SGD(0.0)
        else:
            scale = 2.0**4 if name == "healthy" else 2.0**40
            optimizer = keras.optimizers.LossScaleOptimizer(
                keras.optimizers.SGD(0.01), initial_scale=scale, dynamic_growth_steps=2**31 - 1
            )
        model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        frequency = {"every_n_batches": 4} if name == "by_batch" else {}
        callback = tb_gradviz.GradVizCallback(
            log_dir, (x[:16], y[:16]), layers=["hidden", "head"], weights=True, **frequency
        )
        model.fit(x, y, batch_size=4, epochs=EPOCHS, callbacks=[callback, recorder], verbose=0)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    return iterations


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("keras")
    logdir = tmp_path_factory.mktemp("stalled")
    iterations = {
        name: fit(logdir / name, name) for name in ("lr0", "skipping", "healthy", "by_batch")
    }
    client, _ = test_plugin.make_app(logdir)
    return logdir, client, iterations


def flags_of(body, flag):
    return {
        layer["layer"]: f for layer in body["layers"] for f in layer["flags"] if f["flag"] == flag
    }


def test_stalled_raised_on_a_run_whose_learning_rate_is_0(runs, capsys):
    from tb_gradviz import cli

    logdir, client, iterations = runs
    assert iterations["lr0"] == [16, 32, 48]
    detail = "kernel unchanged (update ratio 0): over 16 steps since the previous log event"
    for step in (32, 48):
        body = test_plugin.get_json(client, "/step", run="lr0", step=step)
        assert {
            layer: (f["detail"], f["tensor"]) for layer, f in flags_of(body, "stalled").items()
        } == {
            "hidden": (detail, "weight/kernel"),
            "head": (detail, "weight/kernel"),
        }
    # The first log event has no update record: nothing to judge.
    assert flags_of(test_plugin.get_json(client, "/step", run="lr0", step=16), "stalled") == {}
    (onset,) = [
        o
        for o in test_plugin.get_json(client, "/onset", run="lr0")["onsets"]
        if o["flag"] == "stalled"
    ]
    assert (onset["step"], onset["layer"], onset["tensor"]) == (32, "hidden", "weight/kernel")
    assert (onset["persists"], onset["raised_steps"], onset["last_raised_step"]) == (True, 2, 48)
    assert onset["detail"] == detail
    # check fails on it, by default and when named.
    for fail_on in ([], ["--fail-on", "stalled"]):
        assert cli.main(["check", str(logdir / "lr0"), "--format", "json", *fail_on]) == 1
        (run,) = json.loads(capsys.readouterr().out)["runs"]
        assert [(f["layer"], f["flag"], f["fails"]) for f in run["flags"]] == [
            ("hidden", "stalled", True),
            ("head", "stalled", True),
        ]


def test_skipped_steps_raised_with_the_share_the_optimizer_iterations_give(runs, capsys):
    from tb_gradviz import cli

    logdir, client, iterations = runs
    applied = np.diff([0, *iterations["skipping"]])
    skipped = BATCHES - applied
    # At 2**40 the first epoch's steps all overflow; the scale halves to where they fit.
    assert skipped[0] == BATCHES and 0 < skipped[1] < BATCHES
    steps = iterations["skipping"]
    for step, count in zip(steps, skipped):
        body = test_plugin.get_json(client, "/step", run="skipping", step=step)
        raised = flags_of(body, "skipped_steps")
        if count >= stalled.SKIPPED_SHARE * BATCHES:
            detail = (
                f"the optimizer skipped {count} of {BATCHES} train steps "
                f"({count / BATCHES:.1%}) since the previous log event"
            )
            assert raised == {
                layer: {"flag": "skipped_steps", "detail": detail, "tensor": None}
                for layer in ("hidden", "head")
            }
        else:
            assert raised == {}
    onsets = test_plugin.get_json(client, "/onset", run="skipping")["onsets"]
    (onset,) = [o for o in onsets if o["flag"] == "skipped_steps"]
    judged = skipped >= stalled.SKIPPED_SHARE * BATCHES
    assert (onset["step"], onset["layer"], onset["tensor"]) == (steps[0], "hidden", None)
    assert onset["detail"] == (
        f"the optimizer skipped {BATCHES} of {BATCHES} train steps (100.0%) since the previous "
        "log event"
    )
    assert onset["raised_steps"] == judged.sum() and onset["persists"] == judged.all()
    # check fails on it by default (its onset; the last step raises it not), and counts the
    # steps skipped exactly.
    last_raised = skipped[-1] >= stalled.SKIPPED_SHARE * BATCHES
    assert cli.main(["check", str(logdir / "skipping"), "--format", "json"]) == int(last_raised)
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert "skipped_steps" in [o["flag"] for o in run["onsets"] if o["fails"]]
    assert (
        run["loss_scale"]["skipped"],
        run["loss_scale"]["batches"],
        run["loss_scale"]["exact"],
    ) == (
        EPOCHS * BATCHES - steps[-1],
        EPOCHS * BATCHES,
        True,
    )


def test_a_healthy_run_raises_neither_stalled_nor_skipped_steps(runs, capsys):
    from tb_gradviz import cli

    logdir, client, iterations = runs
    assert iterations["healthy"] == [16, 32, 48]  # no step skipped at 2**4
    onsets = test_plugin.get_json(client, "/onset", run="healthy")["onsets"]
    assert {"stalled", "skipped_steps"} & {o["flag"] for o in onsets} == set()
    assert cli.main(["check", str(logdir / "healthy"), "--format", "json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert (run["loss_scale"]["skipped"], run["loss_scale"]["batches"]) == (0, EPOCHS * BATCHES)
    assert run["flags"] == []


def test_skipped_steps_counted_at_each_batch_end_when_logged_by_batch(runs, capsys):
    from tb_gradviz import cli

    logdir, client, iterations = runs
    # (iterations, batches seen) at each batch end.
    ends = list(zip(iterations["by_batch"][::2], iterations["by_batch"][1::2]))
    assert len(ends) == EPOCHS * BATCHES
    assert cli.main(["check", str(logdir / "by_batch"), "--format", "json"]) in (0, 1)
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    last = run["loss_scale"]["step"]
    # The callback logs at the first batch end where the optimizer reached a multiple of 4.
    batches = next(seen for applied, seen in ends if applied == last)
    assert last == 4 * (ends[-1][0] // 4)
    assert (run["loss_scale"]["skipped"], run["loss_scale"]["batches"]) == (
        batches - last,
        batches,
    )
    # Each event's share: the batches between the events at which 4 more steps were applied.
    logged = [next(seen for applied, seen in ends if applied == s) for s in range(4, last + 1, 4)]
    shares = {
        step: (ran - 4, ran)
        for step, ran in zip(range(4, last + 1, 4), np.diff([0, *logged]))
        if ran - 4 >= stalled.SKIPPED_SHARE * ran
    }
    raised = {}
    for step in range(4, last + 1, 4):
        body = test_plugin.get_json(client, "/step", run="by_batch", step=step)
        found = flags_of(body, "skipped_steps").get("head")
        if found is not None:
            raised[step] = found["detail"]
    assert raised == {
        step: f"the optimizer skipped {count} of {ran} train steps ({count / ran:.1%}) since the "
        "previous log event"
        for step, (count, ran) in shares.items()
    }
    assert shares  # the first event saw every step of the first epoch skipped


# The rules by hand.


def test_stalled_rule_judges_the_largest_update_ratio_over_a_layer_s_weights():
    nan, inf = np.nan, np.inf
    layers = [
        {
            "updates": {
                "kernel": {"update_ratio": np.array([nan, 0, 1e-3, 0, 0])},
                "bias": {"update_ratio": np.array([nan, nan, 0, inf, 0])},
            }
        },
        {"updates": {}},  # a layer without weights
        {},  # columns without update rows (the full records)
    ]
    largest = stalled.largest_update_ratios(layers, 5)
    np.testing.assert_array_equal(largest, [[nan, 0, 1e-3, inf, 0], [nan] * 5, [nan] * 5])
    np.testing.assert_array_equal(
        stalled.stalled_verdicts(largest),
        [[False, True, False, False, True], [False] * 5, [False] * 5],
    )


def test_skipped_steps_rule_raised_from_a_tenth_of_the_batches():
    assert stalled.SKIPPED_SHARE == 0.1
    skipped = np.array([[16, 8, 2, 1, np.nan, 0, 0]])
    batches = np.array([[16, 16, 20, 16, 16, 0, np.nan]])
    np.testing.assert_array_equal(
        stalled.skipped_verdicts(skipped, batches),
        [[True, True, True, False, False, False, False]],
    )


def test_optimizer_columns_count_each_event_s_batches_and_skips():
    fields = list(capture_loss_scale.FIELDS)
    assert fields == [*FIELDS_WITHOUT_BATCHES, "batches", "applied"]
    # Events at steps 0, 8 and 24 of 16 batches each: 16, 8 and 0 skipped.
    values = np.array(
        [
            [2.0**24, 0, 100, 2.0**40, 16, 0],
            [2.0**16, 8, 100, 2.0**40, 32, 8],
            [2.0**16, 24, 100, 2.0**40, 48, 24],
        ]
    )
    found = rule_columns.optimizer_columns(
        rule_columns.LossScaleSeries(fields, [0, 8, 24], values), np.array([0, 4, 8, 24])
    )
    np.testing.assert_array_equal(found["batches"], [16, np.nan, 16, 16])
    np.testing.assert_array_equal(found["skipped"], [16, np.nan, 8, 0])
    assert loss_scale.skipped_steps(fields, [0, 8, 24], values) == {
        "skipped": 24,
        "exact": True,
        "first_scale": 2.0**40,
        "last_scale": 2.0**16,
        "step": 24,
        "batches": 48,
    }
    # A record written before the count: no column, and the skips read from the halvings.
    old = rule_columns.optimizer_columns(
        rule_columns.LossScaleSeries(FIELDS_WITHOUT_BATCHES, [0, 8], values[:2, :4]), [0, 8]
    )
    np.testing.assert_array_equal(old["batches"], [np.nan, np.nan])
    assert (
        loss_scale.skipped_steps(FIELDS_WITHOUT_BATCHES, [0, 8], values[:2, :4])["batches"] is None
    )
    # A count unknown from some event on (an epoch of unknown length) stays unknown.
    values[1:, 4] = np.nan
    np.testing.assert_array_equal(
        rule_columns.optimizer_columns(
            rule_columns.LossScaleSeries(fields, [0, 8, 24], values), [0, 8, 24]
        )["skipped"],
        [16, np.nan, np.nan],
    )


def test_batch_count_leaves_out_the_steps_made_outside_the_fits():
    count = capture_loss_scale.BatchCount()
    assert np.isnan(count.values(5)).all()  # no fit yet (a custom training loop)
    count.begin_fit(5)  # trained 5 steps before
    count.epoch_ended(10)  # by epoch: the 10 steps fit announced
    assert count.values(12) == (10, 7)
    count.end_fit(12)
    count.begin_fit(20)  # 8 steps made between the fits
    count.batch_ended(3)  # by batch: the index of the last batch that ended
    assert count.values(22) == (14, 9)
    count.epoch_ended()
    assert count.values(22) == (14, 9)
    count.epoch_ended(None)  # an epoch of unknown length
    assert np.isnan(count.values(22)[0])


def test_the_new_flags_are_rules_of_health():
    assert health.FLAGS[-2:] == ("stalled", "skipped_steps")
    assert list(health.rules()) == list(health.FLAGS)
