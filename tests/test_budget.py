"""The cost budget: logging takes a bounded share of training time."""

import time
import warnings

import eventdata
import keras
import numpy as np
import pytest

from tb_gradviz import GradVizCallback
from tb_gradviz.capture import budget, probe


class FakeClock:
    """Seconds that pass only when a test says so; `outside` counts those spent outside fits."""

    def __init__(self):
        self.now = 0.0
        self.outside = 0.0

    def __call__(self):
        return self.now


def simulate(share, train_step, log_event, batches, asked=1):
    """Drives a `Budget` as the callback does, on a clock: returns `(Budget, logged batches)`."""
    clock = FakeClock()
    spent = budget.Budget(share, asked=asked, clock=clock)
    spent.begin_fit(0, rebuilt=True)
    logged = []
    for batch in range(1, batches + 1):
        clock.now += train_step
        spent.passed(1)
        if spent.due:
            spent.log_started()
            clock.now += log_event
            spent.log_ended()
            logged.append(batch)
    spent.end_fit()
    return spent, logged


def test_a_budget_of_two_percent_holds_when_a_log_event_costs_seventeen_train_steps():
    spent, logged = simulate(0.02, train_step=0.003, log_event=0.05, batches=20_000)
    assert 0.01 <= spent.share <= 0.03
    # 0.05 * 0.98 / (0.02 * 0.003) = 816.7 steps: events one interval apart from the second on.
    assert spent.interval == 817 and logged[:3] == [1, 2, 819]
    assert all(b - a == 817 for a, b in zip(logged[1:], logged[2:]))


def test_the_budget_never_logs_more_often_than_asked():
    # Logging is cheap: the interval stays the one asked for.
    spent, logged = simulate(0.5, train_step=0.01, log_event=0.0001, batches=100, asked=5)
    assert spent.interval == 5 and logged == list(range(5, 101, 5))


def test_without_a_budget_a_warning_says_once_that_logging_passes_ten_percent():
    clock = FakeClock()
    spent = budget.Budget(None, clock=clock)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for event in range(5):
            clock.now += 1.0  # training
            spent.log_started()
            clock.now += 1.0  # logging: 50 %
            spent.log_ended()
            # Not before 5 s are measured (the first event is not measured).
            assert len(caught) == (event >= 3)
    messages = [str(w.message) for w in caught]
    assert (
        len(messages) == 1 and "logging takes 50% of training time (3.0 s of 6.0 s)" in messages[0]
    )
    assert "budget=0.02" in messages[0] and spent.interval == 1


@pytest.mark.parametrize(
    "value, error, message",
    [
        ("0.02", TypeError, "Received: budget='0.02' of type str"),
        (True, TypeError, "Received: budget=True of type bool"),
        (0, ValueError, "strictly between 0 and 1"),
        (1.0, ValueError, "Received: budget=1.0"),
        (-0.1, ValueError, "Received: budget=-0.1"),
    ],
)
def test_a_bad_budget_says_what_was_received(value, error, message, tmp_path):
    x = np.zeros((2, 4), "float32")
    with pytest.raises(error, match=message):
        GradVizCallback(tmp_path, (x, x), budget=value)


class Sleep(keras.layers.Layer):
    """Sleeps in eager calls: a train step run eagerly takes at least `seconds`."""

    def __init__(self, seconds, **kwargs):
        super().__init__(**kwargs)
        self.seconds = seconds

    def call(self, x):
        time.sleep(self.seconds)
        return x


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="an eager slow step")
def test_on_a_fit_with_a_slow_step_the_measured_share_lands_near_the_budget(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 2)),
            keras.layers.Conv2D(4, 3, name="conv"),
            Sleep(0.01, name="slow"),
            keras.layers.MaxPooling2D(name="pool"),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )
    model.compile("sgd", "mse", run_eagerly=True)
    x = np.random.default_rng(0).normal(size=(400, 8, 8, 2)).astype("float32")
    y = np.zeros((400, 1), "float32")
    callback = GradVizCallback(
        tmp_path, (x[:4], y[:4]), layers=["conv", "pool"], every_n_batches=1, budget=0.05
    )
    model.fit(x, y, batch_size=1, epochs=1, verbose=0, callbacks=[callback])
    log = eventdata.load(tmp_path)
    recorded = eventdata.values(log, budget.TAG)
    last = dict(zip(budget.FIELDS, recorded[-1][1]))
    # A log event costs about as much as a step here, on a quiet machine or a busy one (a busy
    # one slows the eager step more than the compiled pass), so every step logged would take a
    # far larger share than 5 %: the interval is stretched, and the share stays near the budget.
    assert last["budget"] == 0.05 and last["asked_interval"] == 1
    assert last["interval"] > 1
    assert 0.0125 <= last["share"] <= 0.1, last
    steps = [step for step, _ in recorded]
    # The next log event is one interval, the one decided at the event before it, on.
    for (step, values), following in zip(recorded, steps[1:]):
        assert following - step == dict(zip(budget.FIELDS, values))["interval"]


def test_without_a_budget_nothing_more_is_written():
    assert budget.Budget(None).records() == []


# The callback on a real fit, timed by a fake clock: each train step (or epoch) and each log
# event takes the seconds a test gives it, and nothing else takes any.


class Ticks(keras.callbacks.Callback):
    """Puts training on the clock: `step_seconds(step)` after each optimizer step, or
    `epoch_seconds` after each epoch, and `between` seconds outside each fit, before it.

    Listed before the `GradVizCallback`, so that a step's time has passed when it decides.
    """

    def __init__(self, clock, step_seconds=None, epoch_seconds=0.0, between=0.0):
        super().__init__()
        self.clock, self.step_seconds = clock, step_seconds
        self.epoch_seconds, self.between = epoch_seconds, between

    def on_train_begin(self, logs=None):
        self.clock.now += self.between
        self.clock.outside += self.between

    def on_train_batch_end(self, batch, logs=None):
        if self.step_seconds is not None:
            step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            self.clock.now += self.step_seconds(step)

    def on_epoch_end(self, epoch, logs=None):
        self.clock.now += self.epoch_seconds


def timed_log_events(monkeypatch, clock, seconds):
    """Makes each probe pass take `seconds` on the clock; returns the list that collects, for
    each log event, when it began in time spent within fits."""
    began = []
    new_capture = probe.new_capture

    def timed_capture(*args, **kwargs):
        capture = new_capture(*args, **kwargs)
        run = capture.run

        def timed_run(*run_args, **run_kwargs):
            began.append(clock.now - clock.outside)
            clock.now += seconds
            return run(*run_args, **run_kwargs)

        capture.run = timed_run
        return capture

    monkeypatch.setattr(probe, "new_capture", timed_capture)
    return began


def tiny_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((4, 4, 1)),
            keras.layers.MaxPooling2D(name="pool"),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )
    model.compile("sgd", "mse")
    return model


def fake_fits(tmp_path, monkeypatch, step_seconds, event_seconds, fits, steps_per_fit, **kwargs):
    """`fits` calls of `fit(epochs=1)` of `steps_per_fit` steps each with one callback on a fake
    clock, 2 s outside each fit: returns `(budget records, when each event began)`."""
    clock = FakeClock()
    began = timed_log_events(monkeypatch, clock, event_seconds)
    x = np.linspace(-1, 1, steps_per_fit * 16, dtype="float32").reshape(steps_per_fit, 4, 4, 1)
    y = np.ones((steps_per_fit, 1), "float32")
    callback = GradVizCallback(tmp_path, (x[:2], y[:2]), **kwargs)
    callback._budget._clock = clock  # the callback's budget reads the fake clock
    ticks = Ticks(clock, step_seconds, between=2.0)
    model = tiny_model()
    for _ in range(fits):
        model.fit(x, y, batch_size=1, epochs=1, verbose=0, callbacks=[ticks, callback])
    recorded = [
        (step, dict(zip(budget.FIELDS, values)))
        for step, values in eventdata.values(eventdata.load(tmp_path), budget.TAG)
    ]
    return recorded, began


def assert_within_budget(recorded, began, event_seconds, share, warm_up=5, window=20):
    """Each two events are one interval apart, the one decided at the first of them, a whole
    multiple of the one asked; logging takes 0.5x-1.5x `share` of the time within fits over
    every `window` consecutive events after the first `warm_up`."""
    steps = [step for step, _ in recorded]
    for (step, fields), following in zip(recorded, steps[1:]):
        assert following - step == fields["interval"], (step, following, fields)
        assert fields["interval"] % fields["asked_interval"] == 0
    ends = [start + event_seconds for start in began]
    shares = [
        window * event_seconds / (ends[last] - ends[last - window])
        for last in range(warm_up + window, len(ends))
    ]
    assert len(shares) >= 20 and 0.5 * share <= min(shares) and max(shares) <= 1.5 * share, (
        min(shares),
        max(shares),
    )


def test_a_budget_holds_across_fifty_repeated_fits(tmp_path, monkeypatch):
    # Each fit reset the interval to the one asked and left its first event out of the
    # measurement: 50 fits of 20 steps logged at least twice each.
    recorded, began = fake_fits(
        tmp_path, monkeypatch, lambda step: 0.05, 0.01, fits=50, steps_per_fit=20,
        every_n_batches=1, budget=0.02,
    )  # fmt: skip
    # The first event (it compiles) is left out; the second measures 0.01 s of logging against
    # 0.05 s per step: 0.01 * 0.98 / (0.02 * 0.05) = 9.8, so every 10 steps from then on,
    # across the fits, and the 2 s between fits is not training.
    assert [step for step, _ in recorded] == [1] + list(range(2, 1001, 10))
    assert [fields["interval"] for _, fields in recorded] == [1] + [10] * 100
    last = recorded[-1][1]
    assert last["log_seconds"] == pytest.approx(100 * 0.01)
    assert last["train_seconds"] == pytest.approx(0.05 + 99 * 10 * 0.05)
    assert_within_budget(recorded, began, 0.01, 0.02)


def test_a_budget_holds_across_fifty_repeated_fits_of_one_epoch(tmp_path, monkeypatch):
    # 50 fit(epochs=1) of 0.5 s with an event of 1 s logged 50 events: 67 % of the time.
    clock = FakeClock()
    began = timed_log_events(monkeypatch, clock, 1.0)
    x, y = np.ones((2, 4, 4, 1), "float32"), np.ones((2, 1), "float32")
    callback = GradVizCallback(tmp_path, (x, y), budget=0.02)
    callback._budget._clock = clock
    ticks = Ticks(clock, epoch_seconds=0.5, between=2.0)
    model = tiny_model()
    for _ in range(50):
        model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[ticks, callback])
    recorded = eventdata.values(eventdata.load(tmp_path), budget.TAG)
    # The first event is left out, the second decides 1 * 0.98 / (0.02 * 0.5) = 98 epochs.
    assert [step for step, _ in recorded] == [1, 2] and len(began) == 2
    assert [dict(zip(budget.FIELDS, v))["interval"] for _, v in recorded] == [1, 98]


@pytest.mark.parametrize(
    "name, step_seconds, asked",
    [
        ("constant", lambda step: 0.01, 1),
        ("growing", lambda step: 0.01 * (1 + step / 200), 1),
        ("growing, every 3 asked", lambda step: 0.01 * (1 + step / 200), 3),
        ("jumping", lambda step: 0.04 if 250 < step <= 500 else 0.01, 1),
        ("jumping down", lambda step: 0.01 if 250 < step <= 500 else 0.04, 1),
    ],
)
def test_within_a_fit_the_interval_follows_the_step_time_without_oscillating(
    tmp_path, monkeypatch, name, step_seconds, asked
):
    # The interval swung from event to event (49, 50, 71, 85 ... 288, 119 ...), with events
    # 10 batches apart, because the budget and the callback counted the units passed apart.
    recorded, began = fake_fits(
        tmp_path, monkeypatch, step_seconds, 0.002, fits=1, steps_per_fit=800,
        every_n_batches=asked, budget=0.02,
    )  # fmt: skip
    assert_within_budget(recorded, began, 0.002, 0.02)
    if name == "constant":
        # 0.002 * 0.98 / (0.02 * 0.01) = 9.8: every 10 steps from the first measured event on.
        assert {fields["interval"] for _, fields in recorded[1:]} == {10}


def test_the_first_event_after_the_model_is_compiled_again_is_left_out(tmp_path, monkeypatch):
    clock = FakeClock()
    timed_log_events(monkeypatch, clock, 0.01)
    x = np.linspace(-1, 1, 20 * 16, dtype="float32").reshape(20, 4, 4, 1)
    y = np.ones((20, 1), "float32")
    callback = GradVizCallback(tmp_path, (x[:2], y[:2]), every_n_batches=1, budget=0.02)
    callback._budget._clock = clock
    ticks = Ticks(clock, lambda step: 0.05, between=2.0)
    model = tiny_model()
    for fit in range(5):
        if fit == 3:
            # A new train function, which compiles in its first steps; the same optimizer.
            model.compile(model.optimizer, "mse")
        model.fit(x, y, batch_size=1, epochs=1, verbose=0, callbacks=[ticks, callback])
    recorded = [
        (step, dict(zip(budget.FIELDS, values)))
        for step, values in eventdata.values(eventdata.load(tmp_path), budget.TAG)
    ]
    assert [step for step, _ in recorded] == [1] + list(range(2, 101, 10))
    measured = {step: (f["log_seconds"], f["train_seconds"]) for step, f in recorded}
    # The event at step 62, the first after the compile, and the 10 steps before it are left
    # out; the schedule holds (every 10 steps), and the next event is measured again.
    assert measured[62] == measured[52] == pytest.approx((6 * 0.01, 0.05 + 5 * 0.5))
    assert measured[72] == pytest.approx((7 * 0.01, 0.05 + 6 * 0.5))
