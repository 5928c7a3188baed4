"""The cost budget: logging takes a bounded share of training time."""

import time
import warnings

import eventdata
import keras
import numpy as np
import pytest

from tb_gradviz import GradVizCallback
from tb_gradviz.capture import budget


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def simulate(share, train_step, log_event, batches, asked=1):
    """Runs the callback's decision on a clock: returns `(Budget, logged batch numbers)`."""
    clock = FakeClock()
    spent = budget.Budget(share, clock=clock)
    logged, last = [], 0
    for batch in range(1, batches + 1):
        clock.now += train_step
        if batch // spent.interval(asked) > last:
            spent.log_started()
            clock.now += log_event
            spent.log_ended()
            logged.append(batch)
            last = batch // spent.interval(asked)
    return spent, logged


def test_a_budget_of_two_percent_holds_when_a_log_event_costs_seventeen_train_steps():
    spent, logged = simulate(0.02, train_step=0.003, log_event=0.05, batches=20_000)
    assert 0.01 <= spent.share <= 0.03
    assert spent.factor > 1 and all(b > a for a, b in zip(logged, logged[1:]))


def test_the_budget_never_logs_more_often_than_asked():
    # Logging is cheap: the interval stays the one asked for.
    spent, logged = simulate(0.5, train_step=0.01, log_event=0.0001, batches=100, asked=5)
    assert spent.factor == 1 and logged == list(range(5, 101, 5))


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
    assert "budget=0.02" in messages[0] and spent.factor == 1


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
    # The next log event is at the next multiple of the interval decided at the one before it:
    # never sooner than the interval asked for, never later than the one decided.
    for (step, values), following in zip(recorded, steps[1:]):
        interval = dict(zip(budget.FIELDS, values))["interval"]
        assert following % interval == 0 and 1 <= following - step <= interval


def test_without_a_budget_nothing_more_is_written():
    assert budget.Budget(None).records(1) == []
