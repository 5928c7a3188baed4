"""The warnings' rules (`format.leading`) on hand-written series: the exact steps they raise at.

Each test sets the rules' constants to small values (a window of 10 steps), so that the series
are short and the expected steps follow from the definitions by hand, whatever the defaults.
"""

import numpy as np
import pytest

from tb_gradviz.board import warning_onset
from tb_gradviz.format import leading, windows


@pytest.fixture(autouse=True)
def small_window(monkeypatch):
    monkeypatch.setattr(windows, "WINDOW", 10)
    monkeypatch.setattr(leading, "WINDOW", 10)
    monkeypatch.setattr(windows, "MIN_POINTS", 3)
    # The past-highs condition off (any value is above 1e-9 times them): judged apart, in
    # tests/test_leading_history.py at the defaults.
    monkeypatch.setattr(leading, "RECORD", 1e-9)
    monkeypatch.setattr(leading, "DRIFT_RECORD", 1e-9)
    monkeypatch.setattr(leading, "GROWTH", 4.0)
    monkeypatch.setattr(leading, "DRIFT", 1.0)
    monkeypatch.setattr(leading, "DRIFT_PER_STEP", 0.05)
    monkeypatch.setattr(leading, "PEAK", 4.0)
    monkeypatch.setattr(leading, "SPIKE", 10.0)
    monkeypatch.setattr(leading, "SPIKE_FLOOR", 1e-3)


def layer(rms, max_abs=None, role="activation", updates=None, name="dense"):
    rms = np.asarray(rms, dtype=np.float64)
    max_abs = 3 * rms if max_abs is None else np.asarray(max_abs, dtype=np.float64)
    return {
        "layer": name,
        "layer_index": 0,
        "tensors": {"activation": {"role": role, "rms": rms, "max_abs": max_abs}},
        "updates": updates or {},
    }


def raised_at(steps, columns, warning):
    found = leading.verdicts(np.asarray(steps), columns)[warning].any(axis=0)
    return [int(s) for s in np.asarray(steps)[found]]


def test_rms_growth_raises_above_four_times_the_window_median():
    steps = np.arange(20)
    rms = np.ones(20)
    rms[12] = 4.5  # the window (steps 2-11) has median 1: 4.5x
    rms[15] = 3.9  # below 4x
    rms[7] = 9.0  # step 7: the window's oldest step, 0, is WINDOW / 2 or more before it
    assert raised_at(steps, [layer(rms, max_abs=np.ones(20))], "rms_growth") == [7, 12]
    # Before the window spans WINDOW / 2 steps no step is judged.
    early = np.ones(20)
    early[4] = 100.0
    assert raised_at(steps, [layer(early, max_abs=np.ones(20))], "rms_growth") == []


def test_max_growth_and_peak_ratio_read_max_abs():
    steps = np.arange(20)
    rms = np.ones(20)
    max_abs = np.full(20, 2.0)
    max_abs[14] = 10.0  # 5x the median 2 of steps 4-13; max / RMS 10 is 5x its median 2
    columns = [layer(rms, max_abs)]
    assert raised_at(steps, columns, "max_growth") == [14]
    assert raised_at(steps, columns, "peak_ratio") == [14]
    assert raised_at(steps, columns, "rms_growth") == []
    # Both grow alike: the peak ratio stays, max |x| grows.
    both = [layer(np.where(steps == 14, 5.0, 1.0), np.where(steps == 14, 10.0, 2.0))]
    assert raised_at(steps, both, "peak_ratio") == []
    assert raised_at(steps, both, "max_growth") == [14]


def test_rms_drift_accumulates_a_steady_rise_beyond_the_allowance():
    # Flat at 1 until step 10, then up 0.2 decade per step. The lowest point of the window plus
    # 0.05 per step to t is step 10's while the window holds it: the drift is
    # (0.2 - 0.05) * (t - 10), above 1.0 from t = 17; past step 20 the window holds the rise
    # only, and the drift is (0.2 - 0.05) * 10 = 1.5 at every step.
    steps = np.arange(40)
    rms = 10.0 ** (0.2 * np.maximum(steps - 10, 0))
    drift = windows.drift(steps, windows.log10(rms[None]), leading.DRIFT_PER_STEP)[0]
    assert drift[16] == pytest.approx(0.9)
    assert drift[20] == pytest.approx(1.5) and drift[39] == pytest.approx(1.5)
    assert raised_at(steps, [layer(rms)], "rms_drift") == list(range(17, 40))
    # rms_growth comes first: step 14 is 10**0.8 = 6.3x the window's median (1).
    assert raised_at(steps, [layer(rms)], "rms_growth")[0] == 14
    # A rise of 0.14 decade per step never passes: (0.14 - 0.05) * 10 = 0.9.
    slower = 10.0 ** (0.14 * np.maximum(steps - 10, 0))
    assert raised_at(steps, [layer(slower)], "rms_drift") == []


def test_update_spike_reads_the_ratio_per_step():
    steps = np.arange(0, 40, 2)  # logged every 2 steps
    ratio = np.full(20, 2e-3)  # 1e-3 per step
    ratio[15] = 0.3  # 0.15 per step: 150x the median
    ratio[17] = 2e-3 * 9  # 9x: below 10x
    interval = np.full(20, 2.0)
    interval[0] = np.nan  # the first event has no update
    updates = {"kernel": {"update_ratio": ratio, "interval": interval}}
    columns = [layer(np.ones(20), updates=updates)]
    assert raised_at(steps, columns, "update_spike") == [30]
    # Above 10x but below the floor of 1e-3 per step: not raised.
    quiet = {"kernel": {"update_ratio": ratio / 1000, "interval": interval}}
    assert raised_at(steps, [layer(np.ones(20), updates=quiet)], "update_spike") == []


def test_onset_names_the_first_tensor_in_step_order():
    steps = np.arange(20)
    rms = np.ones(20)
    rms[12] = 5.0
    first = layer(np.ones(20), name="a")
    first["tensors"]["output_gradient"] = {
        "role": "output_gradient",
        "rms": rms,
        "max_abs": 3 * np.ones(20),
    }
    second = dict(layer(rms, max_abs=3 * np.ones(20), name="b"), layer_index=1)
    # The forward pass (b's activation) comes before the backward pass (a's output gradient).
    (growth,) = [
        o for o in warning_onset.onsets(steps, [first, second]) if o["flag"] == "rms_growth"
    ]
    assert (growth["step"], growth["layer"], growth["tensor"]) == (12, "b", "activation")
    assert growth["class"] == "warning" and growth["raised_steps"] == 1
    assert growth["detail"] == "RMS 5, 5x its median 1 over steps 2-11"


def test_warning_detail_quotes_the_rules_median_of_logs_not_the_median_of_values(monkeypatch):
    # A window of 12: step 6 is the first judged, its window steps 0-5. The rule's baseline
    # of [1, 1, 1, 100, 100, 100] is 10 ** median(log10) = 10 (the geometric mean of the two
    # middle values), so 60 is 6x it and raised; np.median's 50.5 would make it 1.19x, under
    # the rule's own threshold.
    monkeypatch.setattr(windows, "WINDOW", 12)
    monkeypatch.setattr(leading, "WINDOW", 12)
    steps = np.arange(7)
    rms = np.array([1, 1, 1, 100, 100, 100, 60], dtype=np.float64)
    assert windows.baseline(steps, rms, 6) == pytest.approx(10.0)
    (growth,) = [
        o
        for o in warning_onset.onsets(steps, [layer(rms, max_abs=rms)])
        if o["flag"] == "rms_growth"
    ]
    assert growth["step"] == 6
    assert growth["detail"] == "RMS 60, 6x its median 10 over steps 0-5"


def test_the_last_step_alone_is_judged_as_within_the_whole_run():
    # The callback judges each event's step alone (`at`), the board every step: they agree.
    rng = np.random.default_rng(0)
    steps = np.cumsum(rng.integers(1, 4, size=60))
    rms = np.exp(rng.normal(size=60))
    rms[rng.random(60) < 0.1] = np.nan
    columns = [layer(rms, max_abs=rms * np.exp(rng.normal(size=60)))]
    whole = leading.verdicts(steps, columns)
    for t in range(len(steps)):
        alone = leading.verdicts(steps[: t + 1], [_cut(columns[0], t + 1)], at=[t])
        for warning in leading.WARNINGS:
            assert alone[warning][0, t] == whole[warning][0, t], (warning, t)


def test_the_windows_median_is_numpys_nanmedian():
    rng = np.random.default_rng(1)
    values = rng.normal(size=(5, 40, 9))
    values[rng.random(values.shape) < 0.4] = np.nan
    values[0, 0] = np.nan
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
        expected = np.nanmedian(values, axis=2)
    np.testing.assert_array_equal(windows.nanmedian(values), expected)


def _cut(column, end):
    tensors = {
        name: {k: v if k == "role" else v[:end] for k, v in t.items()}
        for name, t in column["tensors"].items()
    }
    return dict(column, tensors=tensors)


def _reference(steps, logs, judge):
    """Each (series, step) judged by the rules' words, one window at a time: `judge(now, past,
    ages)` on the window's finite values (`WINDOW` steps before, spanning `WINDOW / 2` or more,
    `MIN_POINTS` finite values or more)."""
    out = np.zeros(logs.shape, bool)
    for t, step in enumerate(steps):
        inside = (steps >= step - windows.WINDOW) & (steps < step)
        if not inside.any() or step - steps[inside][0] < windows.WINDOW / 2:
            continue
        for s in range(len(logs)):
            past, ages = logs[s, inside], step - steps[inside]
            finite = np.isfinite(past)
            if finite.sum() >= windows.MIN_POINTS and np.isfinite(logs[s, t]):
                out[s, t] = judge(logs[s, t], past[finite], ages[finite])
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_windowed_rules_judge_every_pair_as_the_rules_say(seed):
    # Noisy series with jumps, gaps (NaN) and irregular steps: most pairs are ruled out by the
    # windows' minima, the rest judged on their gathered windows; every pair as by hand.
    rng = np.random.default_rng(seed)
    steps = np.cumsum(rng.integers(1, 4, size=160))
    logs = np.cumsum(rng.normal(0, 0.15, size=(6, 160)), axis=1)
    logs[rng.random(logs.shape) < 0.05] += 1.5
    logs[rng.random(logs.shape) < 0.1] = np.nan
    threshold = np.log10(leading.GROWTH)
    np.testing.assert_array_equal(
        windows.median_exceeds(steps, logs, threshold),
        _reference(steps, logs, lambda now, past, _: now - np.median(past) > threshold),
    )
    drift = leading.DRIFT_PER_STEP
    np.testing.assert_array_equal(
        windows.drift_exceeds(steps, logs, leading.DRIFT, leading.DRIFT_PER_STEP),
        _reference(steps, logs, lambda now, past, ages: now - np.min(past + drift * ages) > 1.0),
    )
    # Some pairs raise each rule, some are judged and do not.
    assert 0 < windows.median_exceeds(steps, logs, threshold).sum() < logs.size / 4
    assert (
        0
        < windows.drift_exceeds(steps, logs, leading.DRIFT, leading.DRIFT_PER_STEP).sum()
        < logs.size / 4
    )
