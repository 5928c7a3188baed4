"""The warnings at their default constants on constructed series: where they must fire and where
they must not (a tenfold swing a layer has shown before, a warm-up, noisy steady updates)."""

import numpy as np
import pytest

from tb_gradviz.format import leading, records, windows


def columns(rms=None, update_ratio=None, steps=None):
    """One layer's columns: an output gradient of RMS `rms` (max |x| 3x it) and a kernel whose
    per-step update ratio is `update_ratio`."""
    n = len(steps)
    rms = np.ones(n) if rms is None else np.asarray(rms, dtype=np.float64)
    tensor = {"role": records.OUTPUT_GRADIENT, "count": np.full(n, 1e4), "rms": rms}
    tensor["max_abs"] = 3 * rms
    updates = {}
    if update_ratio is not None:
        updates["kernel"] = {"update_ratio": np.asarray(update_ratio), "interval": np.ones(n)}
    return [
        {
            "layer": "pool",
            "layer_index": 0,
            "tensors": {"output_gradient": tensor},
            **{"updates": updates},
        }
    ]


def raised(steps, layers):
    found = leading.verdicts(np.asarray(steps), layers)
    return {w: np.asarray(steps)[found[w].any(axis=0)].tolist() for w in leading.WARNINGS}


def swing(steps, period=130, width=0.08):
    """A tenfold swing every `period` steps: a narrow bump in log10 RMS, at its peak at step 0."""
    phase = (np.asarray(steps) % period) / period
    return 10.0 ** (np.exp(-((phase / width) ** 2)) + np.exp(-(((phase - 1) / width) ** 2)))


@pytest.mark.parametrize("every", [1, 10])
def test_a_tenfold_swing_every_130_steps_that_the_layer_has_shown_before_raises_nothing(every):
    steps = np.arange(0, 3000, every)
    assert raised(steps, columns(rms=swing(steps), steps=steps)) == {
        w: [] for w in leading.WARNINGS
    }


def test_growth_past_the_layer_s_own_highs_is_raised():
    # The same swing, then a rise to 25x: over 2x every height of the 200 steps before.
    steps = np.arange(1000)
    rms = swing(steps)
    rms[900:] = 25.0 * np.arange(1, 101) ** 0.5
    found = raised(steps, columns(rms=rms, steps=steps))
    assert found["rms_growth"][0] == 900 and found["max_growth"][0] == 900


@pytest.mark.parametrize("growth, within, every", [(1.03, 60, 1), (1.05, 30, 1), (1.03, 60, 10)])
def test_a_steady_growth_of_update_size_raises_update_growth_within_its_steps(
    growth, within, every
):
    steps = np.arange(0, 400, every)
    rng = np.random.default_rng(0)
    noise = np.exp(rng.normal(0, 0.1, len(steps)))
    ratio = 1e-3 * growth ** np.maximum(steps - 200, 0) * noise
    found = raised(steps, columns(update_ratio=ratio, steps=steps))
    assert found["update_growth"] and 200 < found["update_growth"][0] <= 200 + within
    # Before the growth, nothing.
    assert all(step > 200 for hits in found.values() for step in hits)


@pytest.mark.parametrize("warmup", [50, 100, 300, 1000])
def test_a_linear_warm_up_then_cosine_decay_raises_nothing(warmup):
    steps = np.arange(1, 5000)
    rate = np.where(steps < warmup, steps / warmup, 0.5 + 0.5 * np.cos(np.pi * steps / 5000))
    ratio = 1e-3 * rate * np.exp(np.random.default_rng(1).normal(0, 0.2, len(steps)))
    assert raised(steps, columns(update_ratio=ratio, steps=steps))["update_growth"] == []


def test_noisy_steady_updates_raise_no_update_growth_in_10000_steps():
    steps = np.arange(10_000)
    ratio = 1e-3 * np.exp(np.random.default_rng(2).normal(0, 0.3, len(steps)))
    found = raised(steps, columns(update_ratio=ratio, steps=steps))
    assert found["update_growth"] == [] and found["update_spike"] == []


def test_update_growth_leaves_out_the_first_steps_and_updates_below_its_floor():
    steps = np.arange(300)
    # Up 100x over the first 50 steps (a warm-up from near 0), flat after.
    early = 1e-3 * np.minimum(steps + 1, 50) / 50
    assert raised(steps, columns(update_ratio=early, steps=steps))["update_growth"] == []
    # A steady 5 % growth that stays below the floor.
    tiny = 1e-10 * 1.05 ** np.maximum(steps - 100, 0)
    assert raised(steps, columns(update_ratio=tiny, steps=steps))["update_growth"] == []


def test_the_update_trend_is_the_median_over_the_last_steps_whatever_the_spacing():
    steps = np.array([0, 1, 2, 3, 10, 20, 21])
    logs = np.array([[0.0, 4.0, 1.0, 2.0, 7.0, 5.0, np.nan]])
    # SMOOTH = 3 steps: [0], [0, 4], [0, 4, 1], [4, 1, 2], [7], [5], [5, NaN].
    trend = windows.smoothed(steps, logs, 3)
    np.testing.assert_array_equal(trend, [[0.0, 2.0, 1.0, 2.0, 7.0, 5.0, 5.0]])


@pytest.mark.parametrize("values, raised_at_all", [(32, False), (leading.UPDATE_MIN_COUNT, True)])
def test_update_growth_judges_weights_of_256_values_or_more(values, raised_at_all):
    # A recorded kernel of `values` values whose update ratio grows 5 % per step from step 200.
    steps = np.arange(400)
    ratio = 1e-3 * 1.05 ** np.maximum(steps - 200, 0)
    layers = columns(update_ratio=ratio, steps=steps)
    layers[0]["tensors"]["weight/kernel"] = {
        "role": records.WEIGHT,
        "count": np.full(400, float(values)),
        "rms": np.ones(400),
        "max_abs": np.ones(400),
    }
    assert bool(raised(steps, layers)["update_growth"]) is raised_at_all


@pytest.mark.parametrize("at", [[399], [398, 399], None])
def test_a_few_judged_steps_read_their_windows_directly_as_the_sparse_table_does(monkeypatch, at):
    rng = np.random.default_rng(3)
    steps = np.cumsum(rng.integers(1, 3, size=400))
    logs = rng.normal(0, 0.3, size=(70, 400))
    logs[rng.random(logs.shape) < 0.1] = np.nan

    def judged():
        return (
            windows.median_exceeds(steps, logs, 0.5, at),
            windows.drift_exceeds(steps, logs, 0.3, 0.005, at),
            windows.record_exceeds(steps, logs, 0.2, leading.HISTORY, at),
        )

    direct = judged()
    monkeypatch.setattr(windows, "FEW", -1)  # every step through the sparse table
    for fast, table in zip(direct, judged()):
        np.testing.assert_array_equal(fast, table)
    assert all(found.any() for found in direct[:2])


def quiet_rise(steps, end, per_step=0.027, start=200):
    """RMS flat at 1, then up `per_step` decades a step, without noise, from `start` to `end`."""
    return 10.0 ** (per_step * np.clip(np.asarray(steps) - start, 0, end - start))


def test_a_quiet_rise_of_a_decade_that_a_healthy_gradient_shows_raises_no_rms_drift():
    # Up 1.35 decades over 50 steps, then flat: a drift of 1.1 decades (over DRIFT), as the
    # small biases' gradients of healthy runs rise while they learn, never 1.5x over the step
    # before.
    steps = np.arange(400)
    rms = quiet_rise(steps, end=250)
    drift = windows.drift(steps, windows.log10(rms[None]), leading.DRIFT_PER_STEP)[0]
    assert np.nanmax(drift) == pytest.approx(1.1) and np.nanmax(drift) > leading.DRIFT
    assert raised(steps, columns(rms=rms, steps=steps)) == {w: [] for w in leading.WARNINGS}


def test_a_rise_that_jumps_past_the_layer_s_highs_raises_rms_drift_at_one_decade():
    # The same rise with one step at 1.8x its trend: over 1.5x every height of the 200 steps
    # before while the drift is 1.245 decades (over DRIFT, under DRIFT_ALONE), and under 2x
    # them (no growth warning).
    steps = np.arange(400)
    rms = quiet_rise(steps, end=250)
    rms[245] *= 1.8
    found = raised(steps, columns(rms=rms, steps=steps))
    assert found["rms_drift"] == [245]
    assert found["rms_growth"] == [] and found["max_growth"] == []


def test_a_quiet_rise_is_raised_once_its_drift_passes_drift_alone():
    # A rise of 0.027 decade a step that goes on: its drift is 0.022 x (t - 200), over 1.5
    # decades from step 269 (over 1 decade from step 246, where a jump would be raised).
    steps = np.arange(400)
    found = raised(steps, columns(rms=quiet_rise(steps, end=400), steps=steps))
    assert found["rms_drift"][0] == 269
    assert found["rms_growth"] == []


def test_on_the_train_steps_digest_a_growth_holds_two_logged_steps_before_it_is_raised():
    # One odd batch 20x the window, back the next step: a growth on the probe's digest, nothing
    # on the train step's (`in_step`); a rise that stays is raised there one logged step later.
    steps = np.arange(600)
    rms = np.ones(len(steps))
    rms[300] = 20.0
    rms[500:] = 100.0 * np.arange(1, 101) ** 0.5
    layers = columns(rms=rms, steps=steps)
    probe = leading.verdicts(steps, layers)
    in_step = leading.verdicts(steps, layers, in_step=np.ones(len(steps), bool))
    for warning in ("rms_growth", "max_growth"):
        assert steps[probe[warning][0]].tolist()[:2] == [300, 500]
        assert steps[in_step[warning][0]].tolist()[0] == 501
    # Judged at a few steps only (the callback's last event), the same answer at those steps.
    for at in ([300], [301], [500], [501], [300, 501]):
        part = leading.verdicts(steps, layers, at=at, in_step=np.ones(len(steps), bool))
        for warning in leading.WARNINGS:
            np.testing.assert_array_equal(part[warning][:, at], in_step[warning][:, at])
            assert not np.delete(part[warning], at, axis=1).any()
    # A probe step before an in-step one does not need to hold: the rule reads the step's own.
    mixed = np.ones(len(steps), bool)
    mixed[300] = False
    assert leading.verdicts(steps, layers, in_step=mixed)["rms_growth"][0, 300]
