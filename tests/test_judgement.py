"""One judgement per log event: what `stop_on=` and the full-records keeper read at each step is
what `/onset` and `tb-gradviz check` name, on real fits that raise flags and warnings (run on
every backend: tests/run.sh lists this file among the cross-backend ones)."""

import eventdata
import numpy as np
import pytest
import synthetic
import test_onset
from test_stop_on import GrowFactor

from tb_gradviz.format import events, judgement, leading, records, storage

keras = pytest.importorskip("keras")

SKIP_BATCHES = 16


class _Raised:
    """A `stop_on` callable that never stops and keeps what each event raised."""

    def __init__(self):
        self.seen = []

    def __call__(self, raised):
        self.seen.extend(raised)
        return False

    def onsets(self):
        """`{flag: (step, layer, tensor)}` of the first event that raised each."""
        found = {}
        for entry in sorted(self.seen, key=lambda entry: entry["step"]):
            found.setdefault(entry["flag"], (entry["step"], entry["layer"], entry["tensor"]))
        return found


def _scale_run(logdir, fault, seen, **options):
    """The dense network of test_onset with its scale layer changed by `fault` during fit
    (`options`: more of the callback's arguments)."""
    from tb_gradviz import GradVizCallback

    scale = test_onset.Scale(name="scale")
    steps = 70 if fault == "growth" else 8
    model, x, y = test_onset.middle_layer_network(scale, examples=4 * steps)
    changes = {
        "nan": test_onset.SetFactorAt(scale, 5, float("nan")),
        "vanish": test_onset.SetFactorAt(scale, 5, 1e-6),
        "growth": GrowFactor(scale, 60),
    }
    callback = GradVizCallback(
        logdir,
        (x[:8], y[:8]),
        layers=["d1", "scale", "d2", "logits"],
        every_n_batches=1,
        stop_on=seen,
        full_records=0,
        **options,
    )
    model.fit(x, y, batch_size=4, verbose=0, callbacks=[changes[fault], callback], shuffle=False)


def _optimizer_run(logdir, kind, seen):
    """A small dense network with weights logged: a learning rate of 0 (`stalled`), a loss
    scale of 2**40 under mixed_float16 (`skipped_steps`), or a one-unit output layer logged at
    every step (its bias holds one value)."""
    from tb_gradviz import GradVizCallback

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4 * SKIP_BATCHES, 8)).astype("float32")
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16" if kind == "skipping" else "float32")
    try:
        units = 1 if kind == "one_unit" else 3
        model = keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(16, activation="relu", name="hidden"),
                keras.layers.Dense(units, dtype="float32", name="out"),
            ]
        )
        optimizer = {
            "lr0": lambda: keras.optimizers.SGD(0.0),
            "one_unit": lambda: keras.optimizers.SGD(0.02),
            "skipping": lambda: keras.optimizers.LossScaleOptimizer(
                keras.optimizers.SGD(0.01), initial_scale=2.0**40, dynamic_growth_steps=2**31 - 1
            ),
        }[kind]()
        y = rng.standard_normal((len(x), units)).astype("float32")
        model.compile(optimizer, "mse")
        frequency = {"every_n_batches": 1} if kind == "one_unit" else {}
        callback = GradVizCallback(
            logdir,
            (x[:16], y[:16]),
            layers=["hidden", "out"],
            weights=True,
            stop_on=seen,
            full_records=0,
            **frequency,
        )
        epochs = 6 if kind == "one_unit" else 3
        model.fit(x, y, batch_size=4, epochs=epochs, callbacks=[callback], verbose=0)
    finally:
        keras.mixed_precision.set_global_policy(previous)


RUNS = {
    "nan": lambda logdir, seen: _scale_run(logdir, "nan", seen),
    "vanish": lambda logdir, seen: _scale_run(logdir, "vanish", seen),
    "growth": lambda logdir, seen: _scale_run(logdir, "growth", seen),
    "lr0": lambda logdir, seen: _optimizer_run(logdir, "lr0", seen),
    "skipping": lambda logdir, seen: _optimizer_run(logdir, "skipping", seen),
    "one_unit": lambda logdir, seen: _optimizer_run(logdir, "one_unit", seen),
}


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    """`{run: (what the callback raised, first by flag; what check names)}` of every run."""
    root = tmp_path_factory.mktemp("judged")
    found = {}
    for name, fit in RUNS.items():
        seen = _Raised()
        fit(root / name, seen)
        _, onsets, _ = test_onset.onsets_of(root, name)
        named = {flag: (o["step"], o["layer"], o["tensor"]) for flag, o in onsets.items()}
        found[name] = (seen.onsets(), named)
    return root, found


@pytest.mark.parametrize("run", sorted(RUNS))
def test_what_stop_on_sees_is_what_check_names(judged, run):
    _, found = judged
    seen, named = found[run]
    assert seen == named


def test_the_runs_raise_flags_and_warnings_of_every_kind_they_were_built_for(judged):
    _, found = judged
    raised = {flag for seen, _ in found.values() for flag in seen}
    assert {"nonfinite", "vanishing", "stalled", "skipped_steps", "rms_growth"} <= raised


def test_an_onset_of_skipped_steps_keeps_its_full_records(judged):
    root, found = judged
    step, _, _ = found["skipping"][1]["skipped_steps"]
    log = eventdata.load(root / "skipping")
    kept = {s for s, _ in eventdata.values(log, records.stats_tag("hidden", "activation"))}
    # full_records=0: the schedule keeps none, the onset (and the event before it, if any) do.
    assert step in kept


def test_stop_on_skipped_steps_stops_the_fit_that_skips_them(tmp_path):
    from tb_gradviz import GradVizCallback

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4 * SKIP_BATCHES, 8)).astype("float32")
    y = rng.standard_normal((len(x), 3)).astype("float32")
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(16, activation="relu", name="hidden"),
                keras.layers.Dense(3, dtype="float32", name="out"),
            ]
        )
        model.compile(
            keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**40),
            "mse",
        )
        callback = GradVizCallback(
            tmp_path, (x[:8], y[:8]), layers=["hidden"], stop_on="skipped_steps"
        )
        history = model.fit(x, y, batch_size=4, epochs=6, callbacks=[callback], verbose=0)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    assert len(history.epoch) == 1
    assert "skipped_steps" in {r["flag"] for r in callback.stopped_on}


def tiny_and_large_events(steps, jump_at):
    """Events of two synthetic max pools, `tiny` of one output value and `large` of 128, whose
    output gradients jump 1e4x at `jump_at`; as `synthetic.pool_records` writes them."""
    found = []
    for step in range(steps):
        rng = np.random.default_rng(step)
        scale = 1e4 if step >= jump_at else 1.0
        records_ = synthetic.pool_records(
            rng, "tiny", 0, batch=1, size=2, channels=1, gradient_scale=scale
        )
        records_ += synthetic.pool_records(
            rng, "large", 1, batch=2, size=8, channels=4, gradient_scale=scale
        )
        found.append((step, records_))
    return found


def test_stop_on_leaves_out_a_tensor_of_fewer_than_16_values_as_check_does(tmp_path):
    judge = judgement.Judge(warnings=True)
    raised = []
    log = events.EventLog(storage.location(str(tmp_path / "run")))
    for step, event_records in tiny_and_large_events(leading.WINDOW, 70):
        raised += judge.judge(step, event_records).raised
        log.write(step, event_records)
    log.close()
    # Flags judge every tensor; the warnings leave out those of fewer than MIN_COUNT values.
    assert [r for r in raised if r["layer"] == "tiny" and r["class"] == "warning"] == []
    assert any(r["layer"] == "large" and r["class"] == "warning" for r in raised)
    seen = _Raised()
    seen(raised)
    _, onsets, _ = test_onset.onsets_of(tmp_path, "run")
    assert seen.onsets() == {f: (o["step"], o["layer"], o["tensor"]) for f, o in onsets.items()}
