"""Warnings on a real fit (TensorFlow backend): one is raised before a NaN, `tb-gradviz check
--fail-on` fails on it, and `GradVizCallback(stop_on=...)` stops `fit` on a flag, a warning or
a callable's say, at the step `/onset` names."""

import numpy as np
import pytest
import test_onset

from tb_gradviz import cli
from tb_gradviz.format import leading

keras = pytest.importorskip("keras")

# The scale layer's factor is 1 before GROWTH_STEP and 1000**(s - GROWTH_STEP + 1) at step s:
# its activation's RMS jumps 1000x at GROWTH_STEP (a warning), and is Inf once the factor
# passes float32's range (1000**13 = 1e39 > 3.4e38).
GROWTH_STEP = 60
STEPS = 80
INF_STEP = GROWTH_STEP + 12


class GrowFactor(keras.callbacks.Callback):
    """Multiplies `layer.factor` by 1000 at the end of each optimizer step from `step` on,
    before the callbacks after it log that step."""

    def __init__(self, layer, step):
        super().__init__()
        self.layer, self.step = layer, step

    def on_train_batch_end(self, batch, logs=None):
        if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) >= self.step:
            self.layer.factor.assign(self.layer.factor * 1000.0)


def growing_run(logdir, stop_on=None):
    """A small dense network logged at each of STEPS steps whose `scale` layer grows from
    GROWTH_STEP on; returns the callback."""
    from tb_gradviz import GradVizCallback

    scale = test_onset.Scale(name="scale")
    model, x, y = test_onset.middle_layer_network(scale, examples=STEPS * 4)
    gradviz = GradVizCallback(
        logdir, (x[:8], y[:8]), layers=["scale", "d2"], every_n_batches=1, stop_on=stop_on
    )
    callbacks = [GrowFactor(scale, GROWTH_STEP), gradviz]
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=callbacks, shuffle=False)
    gradviz.iterations = int(model.optimizer.iterations.numpy())
    return gradviz


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    root = tmp_path_factory.mktemp("grown")
    growing_run(root / "run")
    return root


def test_a_warning_precedes_the_nan_on_a_real_fit(grown):
    status, onsets, _ = test_onset.onsets_of(grown, "run")
    assert status == cli.EXIT_FLAGGED  # nonfinite, among the default --fail-on
    nonfinite = onsets["nonfinite"]
    assert (nonfinite["class"], nonfinite["step"]) == ("flag", INF_STEP)
    growth = onsets["rms_growth"]
    assert growth["class"] == "warning"
    assert (growth["step"], growth["layer"], growth["tensor"]) == (
        GROWTH_STEP,
        "scale",
        "activation",
    )
    assert growth["step"] < nonfinite["step"]
    # No warning before the fault: the first steps are not judged, the others are steady.
    assert min(o["step"] for o in onsets.values() if o["class"] == "warning") == GROWTH_STEP


def test_check_fails_on_a_warning_when_asked(grown):
    status, out, err = test_onset.run_check(grown, "--fail-on", "rms_growth")
    assert status == cli.EXIT_FLAGGED
    assert "rms_growth  warning  yes    60" in out
    assert "among --fail-on rms_growth raised" in err
    # Not asked: a warning fails nothing.
    status, out, _ = test_onset.run_check(grown, "--fail-on", "dead")
    assert status == cli.EXIT_OK
    assert "rms_growth  warning  no     60" in out


def test_stop_on_a_flag(tmp_path):
    gradviz = growing_run(tmp_path, stop_on="nonfinite")
    assert gradviz.iterations == INF_STEP
    assert [(r["flag"], r["step"]) for r in gradviz.stopped_on if r["class"] == "flag"][0] == (
        "nonfinite",
        INF_STEP,
    )


def test_stop_on_a_warning(tmp_path):
    gradviz = growing_run(tmp_path, stop_on=["max_growth", "rms_growth"])
    assert gradviz.iterations == GROWTH_STEP
    growth = next(r for r in gradviz.stopped_on if r["flag"] == "rms_growth")
    assert growth == {
        "flag": "rms_growth",
        "class": "warning",
        "step": GROWTH_STEP,
        "layer": "scale",
        "tensor": "activation",
    }


def test_stop_on_a_callable(tmp_path):
    seen = []

    def two_warnings(raised):
        seen.append([(r["flag"], r["step"]) for r in raised])
        return len(seen) == 2

    gradviz = growing_run(tmp_path, stop_on=two_warnings)
    # Called only after an event that raised something: the second such event stops.
    assert gradviz.iterations == GROWTH_STEP + 1
    assert ("rms_growth", GROWTH_STEP) in seen[0]
    assert {step for _, step in seen[0]} == {GROWTH_STEP}
    assert {step for _, step in seen[1]} == {GROWTH_STEP + 1}
    assert gradviz.stopped_on[0]["step"] == GROWTH_STEP + 1


@pytest.mark.parametrize(
    "value, error, message",
    [
        ("sleepy", ValueError, "received unknown ['sleepy']. Received: stop_on='sleepy'"),
        ([], ValueError, "received unknown nothing. Received: stop_on=[]"),
        (["dead", 3], TypeError, "Received: stop_on=['dead', 3]"),
        (3, TypeError, "a list of them, or a callable (raised -> bool)"),
    ],
)
def test_a_bad_stop_on_is_refused_naming_it(tmp_path, value, error, message):
    from tb_gradviz import GradVizCallback

    with pytest.raises(error) as raised:
        GradVizCallback(tmp_path, (np.zeros((1, 2)), np.zeros(1)), stop_on=value)
    assert message in str(raised.value)
    assert "rms_growth" in str(raised.value) and "nonfinite" in str(raised.value)
    assert leading.WARNINGS[-1] in str(raised.value)


def test_stop_on_starts_a_new_history_when_the_steps_go_back(tmp_path):
    # log_now(step=...) from a custom loop may log an earlier step again (a model trained
    # anew): the events before it are no longer its past.
    from tb_gradviz import GradVizCallback

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(16, name="d")])
    x = np.ones((4, 3), dtype="float32")
    callback = GradVizCallback(
        tmp_path, (x, np.zeros((4, 16), "float32")), layers=["d"], loss="mse", stop_on="nonfinite"
    )
    callback.set_model(model)
    for step in (10, 20, 5):
        callback.log_now(step=step)
    assert [event.step for event in callback._judge._events] == [5]
