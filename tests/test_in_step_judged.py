"""In-step events (`digest="step"`) judged as the probe's are: `stop_on` sees at each step what
`/onset` and `tb-gradviz check` name on the written run, and an onset keeps its full records."""

import eventdata
import pytest
import test_judgement
import test_onset
from in_step_runs import BATCH, cnn, data

from tb_gradviz.capture import in_step
from tb_gradviz.format import records

keras = pytest.importorskip("keras")
if keras.backend.backend() != "tensorflow":
    pytest.skip("judged here on TensorFlow's in-step digest", allow_module_level=True)


@pytest.mark.parametrize(
    "fault, flag, in_step_onset", [("nan", "nonfinite", False), ("growth", "rms_growth", True)]
)
def test_what_stop_on_sees_of_an_in_step_fit_is_what_check_names(
    tmp_path, fault, flag, in_step_onset
):
    seen = test_judgement._Raised()
    test_judgement._scale_run(tmp_path / fault, fault, seen, digest="step")
    _, onsets, _ = test_onset.onsets_of(tmp_path, fault)
    named = {name: (o["step"], o["layer"], o["tensor"]) for name, o in onsets.items()}
    assert flag in named
    assert seen.onsets() == named
    # full_records=0: the probe ran at events 0, 2, 5, 9, ... (steps 1, 3, 6, 10, ...), the
    # train step computed the others' digests; the NaN's onset is a probe event, the growth's not.
    log = eventdata.load(tmp_path / fault)
    in_step_steps = [s for s, _ in eventdata.values(log, in_step.SOURCE_TAG)]
    assert in_step_steps[:3] == [2, 4, 5]
    assert (named[flag][0] in in_step_steps) == in_step_onset


def _fit_to_a_nan(log_dir, **stop):
    """Fits `cnn(0.1)` logged at every step from the train step, its fourth batch holding a
    NaN (an in-step event: the probe's are events 0 and 2), stopping as `stop` asks; asserts
    it stopped after that step. Returns the callback."""
    from tb_gradviz import GradVizCallback

    model = cnn(learning_rate=0.1)
    x, y = data(8 * BATCH)
    x[3 * BATCH] = float("nan")
    callback = GradVizCallback(
        str(log_dir),
        probe_data=(x[:BATCH], y[:BATCH]),
        layers=["conv", "dense"],
        every_n_batches=1,
        full_records=0,
        digest="step",
        **stop,
    )
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False, callbacks=[callback])
    assert int(model.optimizer.iterations.numpy()) == 4
    return callback


def test_stop_on_nonfinite_stops_at_the_in_step_event_whose_batch_held_a_nan(tmp_path, capsys):
    _fit_to_a_nan(tmp_path, stop_on_nonfinite=True)
    printed = capsys.readouterr().out
    assert "step 4: NaN or Inf recorded in conv/activation, conv/input_gradient" in printed


def test_stop_on_stops_an_in_step_fit_at_the_onset_with_its_full_records(tmp_path, capsys):
    callback = _fit_to_a_nan(tmp_path, stop_on="nonfinite")
    assert [(r["flag"], r["step"], r["layer"]) for r in callback.stopped_on] == [
        ("nonfinite", 4, "conv")
    ]
    assert "step 4: raised nonfinite (conv, " in capsys.readouterr().out
    log = eventdata.load(tmp_path)
    assert [s for s, _ in eventdata.values(log, in_step.SOURCE_TAG)] == [2, 4]
    # The probe ran at the schedule's events 0 and 2 (steps 1 and 3), and at the onset.
    kept = [s for s, _ in eventdata.values(log, records.stats_tag("conv", "activation"))]
    assert kept == [1, 3, 4]
