"""A plain `tensorboard --logdir` keeps the per-event digest whole, on both loaders.

TensorBoard samples every series of a plugin it does not know (10 steps with
`--load_fast=false`, 100 with the Rust data server) unless
`--samples_per_plugin` names it. The plugin's loader (`board/loader.py`)
sets the digest's default to 0 (keep all) before the data server starts, so
`/onset` judges every logged step; a value the user gives wins.

The run is written in the real format with `events.EventLog` (numpy only):
two layers over `STEPS` steps, with a NaN in one gradient at `NAN_STEP`
alone, which a 100-step sample would most likely miss.
"""

import numpy as np
import pytest
import tbserver
from tensorboard import program

from tb_gradviz.format import digest, events, records, summaries

STEPS = 150
NAN_STEP = 137
LAYERS = ("a", "b")
TENSORS = (records.ACTIVATION, records.OUTPUT_GRADIENT)
LOADERS = ("false", "true")  # --load_fast: the Python multiplexer, the Rust data server


def values_at(layer, tensor, step):
    """A healthy tensor of 8 values; `b`'s output gradient holds a NaN at `NAN_STEP` only."""
    values = np.linspace(-1.0, 1.0, 8) * (1.0 + step / STEPS)
    if (layer, tensor, step) == ("b", records.OUTPUT_GRADIENT, NAN_STEP):
        values[3] = np.nan
    return values


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("digest_sampling")
    log = events.EventLog(root / "run")
    try:
        for step in range(1, STEPS + 1):
            step_records = []
            for index, layer in enumerate(LAYERS):
                for tensor in TENSORS:
                    values = values_at(layer, tensor, step)
                    content = {"layer_index": index, "role": tensor, "index": 0, "shape": [8]}
                    step_records += events.tensor_records(
                        layer,
                        tensor,
                        summaries.linear_histogram(values),
                        summaries.stats_vector(values),
                        content,
                    )
            log.write(step, step_records)
    finally:
        log.close()
    return root


def onset_when_loaded(url):
    """`/onset` of the run once its last step is loaded, else None."""
    try:
        body = tbserver.get_json(f"{url}/data/plugin/gradviz/onset?run=run")
    except OSError:
        return None
    return body if body["last_step"] == STEPS else None


def served_onset(logdir, log_path, load_fast, samples):
    with tbserver.running_tensorboard(
        logdir,
        log_path,
        ready=lambda url: onset_when_loaded(url) is not None,
        extra_args=(f"--load_fast={load_fast}",),
        samples=samples,
    ) as url:
        return onset_when_loaded(url)


@pytest.mark.slow
@pytest.mark.parametrize("load_fast", LOADERS)
def test_plain_tensorboard_judges_every_step_a_nan_at_step_137_named_at_137(
    logdir, tmp_path, load_fast
):
    body = served_onset(logdir, tmp_path / "tensorboard.log", load_fast, samples=())
    assert (body["steps"], body["first_step"], body["last_step"]) == (STEPS, 1, STEPS)
    (nonfinite,) = body["onsets"]
    assert {key: nonfinite[key] for key in ("flag", "step", "layer", "tensor")} == {
        "flag": "nonfinite",
        "step": NAN_STEP,
        "layer": "b",
        "tensor": records.OUTPUT_GRADIENT,
    }
    assert (nonfinite["raised_steps"], nonfinite["persists"]) == (1, False)


@pytest.mark.slow
@pytest.mark.parametrize("load_fast", LOADERS)
def test_plain_tensorboard_serves_the_full_records_of_the_onset_step(logdir, tmp_path, load_fast):
    """Every step holds full records here; a sample of them (10 or 100 steps) would most likely
    not hold step 137, and the layer view at the onset would show an earlier step's."""
    with tbserver.running_tensorboard(
        logdir,
        tmp_path / "tensorboard.log",
        ready=lambda url: onset_when_loaded(url) is not None,
        extra_args=(f"--load_fast={load_fast}",),
        samples=(),
    ) as url:
        body = tbserver.get_json(f"{url}/data/plugin/gradviz/step?run=run&step={NAN_STEP}")
    (b,) = [layer for layer in body["layers"] if layer["layer"] == "b"]
    assert {tensor: b["tensors"][tensor]["step"] for tensor in TENSORS} == dict.fromkeys(
        TENSORS, NAN_STEP
    )


@pytest.mark.slow
@pytest.mark.parametrize("load_fast", LOADERS)
def test_the_users_own_samples_per_plugin_for_the_digest_is_honoured(logdir, tmp_path, load_fast):
    samples = ("--samples_per_plugin", "gradviz=0,histograms=0,gradviz_digest=10")
    body = served_onset(logdir, tmp_path / "tensorboard.log", load_fast, samples)
    # Both loaders keep a reservoir of 10 that always holds the last step.
    assert (body["steps"], body["last_step"]) == (10, STEPS)


@pytest.mark.parametrize(
    "argv, samples",
    [
        ([], {"gradviz_digest": 0, "gradviz": 0}),
        (["--samples_per_plugin=gradviz=5"], {"gradviz": 5, "gradviz_digest": 0}),
        (
            ["--samples_per_plugin=histograms=7"],
            {"histograms": 7, "gradviz_digest": 0, "gradviz": 0},
        ),
        (
            ["--samples_per_plugin=gradviz_digest=10,gradviz=5"],
            {"gradviz_digest": 10, "gradviz": 5},
        ),
    ],
)
def test_tensorboards_flags_keep_the_digest_whole_unless_the_user_sets_it(tmp_path, argv, samples):
    # The installed plugins, found as `tensorboard` finds them (the entry point names the loader).
    board = program.TensorBoard()
    board.configure(argv=[None, "--logdir", str(tmp_path), *argv])
    assert board.flags.samples_per_plugin == samples
    assert digest.PLUGIN_NAME == "gradviz_digest"
