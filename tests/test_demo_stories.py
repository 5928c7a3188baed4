"""What the demo says each run shows is what the run shows, checked cheaply: the same models and
settings as the demo's, trained no longer than the claim needs."""

import json

import pytest
from test_cli import run_cli

keras = pytest.importorskip("keras")

from tb_gradviz import GradVizCallback, demos, divergence_cases  # noqa: E402
from tb_gradviz.format import records  # noqa: E402


def story(run):
    (why,) = [why for name, _, why, _ in demos.demo_plan("all") if name == run]
    return why


@pytest.mark.slow
def test_the_diverging_runs_first_non_finite_value_is_a_float16_gradient_as_its_story_says(
    tmp_path,
):
    # The demo said "its float16 activations overflow"; logged at every step, the first non-finite
    # values are gradients (Inf), while every activation and weight is still finite; the update
    # after them writes NaN into the weights, which a log event every 5 steps records first.
    model, x, y, batch_size = divergence_cases.mixed_case(300, 0, ramp=1.05)
    ramp = divergence_cases.RAMP_START * batch_size
    # The steps before the ramp, where nothing diverges, unlogged.
    model.fit(x[:ramp], y[:ramp], batch_size=batch_size, shuffle=False, verbose=0)
    callback = GradVizCallback(
        tmp_path / demos.DIVERGING_RUN,
        probe_data=(x[:batch_size], y[:batch_size]),
        layers=lambda layer: True,
        every_n_batches=1,
        weights=True,
        stop_on=["nonfinite"],
    )
    model.fit(
        x[ramp:], y[ramp:], batch_size=batch_size, shuffle=False, verbose=0, callbacks=[callback]
    )
    status, out, _ = run_cli("check", tmp_path, "--format", "json", "--fail-on", "nonfinite")
    (run,) = json.loads(out)["runs"]
    (onset,) = [o for o in run["onsets"] if o["flag"] == "nonfinite"]
    assert status == 1 and onset["step"] == run["step"], run
    gradients = {records.INPUT_GRADIENT, records.OUTPUT_GRADIENT}
    assert onset["tensor"] in gradients or onset["tensor"].startswith("weight_gradient/"), onset
    overflow = [o for o in run["onsets"] if o["flag"] == "overflow"]
    assert overflow and overflow[0]["step"] == onset["step"], run["onsets"]
    why = story(demos.DIVERGING_RUN)
    assert "float16 gradients overflow to Inf" in why and "weights to NaN" in why
    assert "activations overflow" not in why


def step_scalars(run_dir, tag):
    """Each step's value of one of `StepScalars`' tags in a run, in step order."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    points = {}
    for path in run_dir.glob("*.scalars*"):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == tag:  # TensorBoard's loader turns a simple_value into a tensor
                    points[event.step] = value.tensor.float_val[0]
    return [points[step] for step in sorted(points)]


def quarters(values):
    quarter = max(1, len(values) // 4)
    return sum(values[:quarter]) / quarter, sum(values[-quarter:]) / quarter


@pytest.mark.slow
def test_the_healthy_plain_network_learns_beyond_chance_in_the_demos_run(tmp_path):
    # "The healthy comparison" ended at chance (accuracy 0.25 -> 0.24 in 12 steps of Adam(1e-3)).
    # The demo's settings, logged once at the end (the logging changes no training).
    run = tmp_path / "plain_relu_bn"
    demos.train_plain_cnn(run, "relu_bn", log_every=10**6, verbose=0)
    accuracy, loss = step_scalars(run, "train/accuracy"), step_scalars(run, "train/loss")
    assert len(accuracy) == len(loss) >= 20
    # Chance is an accuracy of 0.25 and a loss of ln 4 = 1.39.
    first, last = quarters(accuracy)
    assert last >= 0.35 and last > first + 0.1, [round(a, 2) for a in accuracy]
    assert quarters(loss)[1] < 1.3, [round(v, 2) for v in loss]
    assert "its gradient keeps flowing" in story("plain_relu_bn")


def test_the_unscaled_float16_run_underflows_and_trains_as_the_scaled_one_as_its_story_says(
    tmp_path,
):
    # Its story said the gradients underflow and no more; the loss is the same as the scaled run's
    # to a few thousandths at every step, which the story now says: the flag comes first.
    for run, scale in (("scaled", None), ("unscaled", 1.0)):
        demos.train_mixed_cnn(tmp_path / run, scale, log_every=10, verbose=0)
    scaled, unscaled = (
        step_scalars(tmp_path / run, "train/loss") for run in ("scaled", "unscaled")
    )
    assert len(scaled) == len(unscaled) == 10 and min(scaled) > 0.5  # losses, near ln 4 at first
    assert max(abs(a - b) for a, b in zip(scaled, unscaled)) < 0.01, (scaled, unscaled)
    status, out, _ = run_cli("check", tmp_path, "--format", "json", "--fail-on", "underflow")
    flags = {
        r["run"]: [f for f in r["flags"] if f["flag"] == "underflow"]
        for r in json.loads(out)["runs"]
    }
    assert status == 1 and flags["scaled"] == [] and flags["unscaled"], flags
    # Subnormal, not flushed to zero: "(0 to zero, ... subnormal)" in each flag's detail.
    assert all("(0 to zero, " in f["detail"] for f in flags["unscaled"]), flags["unscaled"]
    why = story("mixed_float16_unscaled")
    assert "none reaches zero" in why and "within a few thousandths of the scaled run's" in why
