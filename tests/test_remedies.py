"""What a warning asks the user to do: each onset names its likely cause and remedy in one line,
and `tb-gradviz check` prints it."""

import numpy as np
import pytest
import test_judgement
import test_onset

from tb_gradviz.board import warning_onset
from tb_gradviz.format import events, leading, records, remedies, storage


@pytest.mark.parametrize(
    "warning, role, layer_class, position, expected",
    [
        ("rms_growth", records.ACTIVATION, "Dense", "first", "check the input pipeline"),
        ("rms_growth", records.ACTIVATION, "MultiHeadAttention", None, "QK-norm"),
        ("max_growth", records.ACTIVATION, "Dense", "last", "z-loss"),
        ("rms_drift", records.ACTIVATION, "Conv2D", None, "add normalisation"),
        ("rms_growth", records.OUTPUT_GRADIENT, "Dense", "last", "clipnorm="),
        ("update_spike", "update", "Dense", None, "lower the learning rate"),
        ("peak_ratio", records.ACTIVATION, "Conv2D", "first", "corrupt batch"),
        ("peak_ratio", records.INPUT_GRADIENT, "Conv2D", None, "outliers"),
    ],
)
def test_each_warning_names_its_likely_cause_and_remedy(
    warning, role, layer_class, position, expected
):
    line = remedies.remedy(warning, role, layer_class, position)
    assert expected in line and "\n" not in line


def test_output_logits_are_named_only_for_a_dense_last_layer():
    pooled = remedies.remedy("rms_growth", records.ACTIVATION, "GlobalAveragePooling2D", "last")
    assert "z-loss" not in pooled and "Activations grow" in pooled


def _columns(layer_class, layer_index, growth_at=80, steps=100):
    """One layer's columns whose activation RMS is 1 until `growth_at`, then 1000."""
    rms = np.where(np.arange(steps) >= growth_at, 1000.0, 1.0)
    tensor = {
        "role": records.ACTIVATION,
        "count": np.full(steps, 64.0),
        "rms": rms,
        "max_abs": 3 * rms,
    }
    layer = {
        "layer": "attn",
        "layer_index": layer_index,
        "layer_class": layer_class,
        "tensors": {"activation": tensor},
        "updates": {},
    }
    return np.arange(steps), [layer]


def test_an_attention_layer_s_growth_asks_for_qk_norm_in_its_onset():
    steps, columns = _columns("MultiHeadAttention", layer_index=3)
    (entry, *_) = warning_onset.onsets(steps, columns)
    assert (entry["flag"], entry["step"], entry["layer"]) == ("rms_growth", 80, "attn")
    assert "QK-norm" in entry["remedy"]


def test_the_first_layer_s_growth_asks_to_check_the_input_pipeline():
    steps, columns = _columns("Dense", layer_index=0)
    (entry, *_) = warning_onset.onsets(steps, columns)
    assert "input pipeline" in entry["remedy"]


def test_check_prints_each_warning_s_remedy(tmp_path):
    log = events.EventLog(storage.location(str(tmp_path / "run")))
    for step, event_records in test_judgement.tiny_and_large_events(leading.WINDOW, 70):
        log.write(step, event_records)
    log.close()
    status, out, _ = test_onset.run_check(tmp_path, "--run", "run")
    _, onsets, _ = test_onset.onsets_of(tmp_path, "run")
    warned = [o for o in onsets.values() if o["class"] == "warning"]
    assert warned
    for onset in warned:
        line = f"  {onset['flag']} at {onset['layer']} ({onset['tensor']}): {onset['remedy']}"
        assert line in out
