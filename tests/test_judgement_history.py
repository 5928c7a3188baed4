"""The judge's warnings from the series it keeps as events come (`format/history.py`) are those of
the columns of every event held built anew (`leading.verdicts`), event after event."""

import numpy as np
import pytest

from tb_gradviz.format import (
    digest,
    events,
    judgement,
    leading,
    metadata,
    records,
    summaries,
    windows,
)

# (layer, layer index, {tensor: (role, values)}, {weight: values}): "tiny" holds fewer than
# MIN_COUNT values, "bias" fewer than UPDATE_MIN_COUNT.
LAYERS = (
    (
        "conv",
        0,
        {"activation": 256, "output_gradient": 256, "input_gradient": 512},
        {"kernel": 512, "bias": 8},
    ),
    ("dense", 1, {"activation": 64, "output_gradient": 64, "input_gradient": 256}, {"kernel": 300}),
    ("tiny", 2, {"activation": 4, "output_gradient": 4, "input_gradient": 64}, {}),
)
LOSS_SCALE_FIELDS = (
    "loss_scale",
    "growth_counter",
    "growth_steps",
    "initial_scale",
    "batches",
    "applied",
)


def _log_scales(rng, count):
    """`[count]` log10 sizes: a random walk with a slow swing, steady rises and spikes."""
    walk = np.cumsum(rng.normal(0.0, 0.03, count))
    swing = 0.5 * np.sin(np.arange(count) * 2 * np.pi / rng.uniform(80, 200))
    rises = np.zeros(count)
    for begin in rng.integers(0, count, 4):
        rises[begin:] += 0.01 * np.minimum(np.arange(count - begin), rng.integers(30, 150))
    spikes = np.zeros(count)
    for at in rng.integers(0, count, 12):
        spikes[at : at + rng.integers(1, 6)] += rng.uniform(0.5, 2.0)
    return walk + swing + rises + spikes


class Run:
    """Every tensor's and weight's sizes over `count` events, and each event's records."""

    def __init__(self, seed, count):
        rng = self.rng = np.random.default_rng(seed)
        self.scales = {}
        self.base = {}
        for layer, _, tensors, weights in LAYERS:
            for tensor, size in tensors.items():
                self.base[(layer, tensor)] = rng.normal(size=size)
                self.scales[(layer, tensor)] = _log_scales(rng, count) - 2
            for weight, size in weights.items():
                self.base[(layer, f"weight/{weight}")] = rng.normal(size=size)
                self.base[(layer, f"weight_gradient/{weight}")] = rng.normal(size=size)
                self.scales[(layer, weight)] = _log_scales(rng, count) - 3
        self.peaks = rng.random(count) < 0.02  # a few values far above the rest

    def records(self, event, interval):
        found = []
        for layer, index, tensors, weights in LAYERS:
            content = {"layer_index": index, "layer_class": "Dense", "layer_dtype": "float32"}
            named = [(t, t, None) for t in tensors]
            for weight in weights:
                named += [
                    (records.weight_tensor_name(role, weight), role, weight)
                    for role in (records.WEIGHT, records.WEIGHT_GRADIENT)
                ]
            for i, (name, role, weight) in enumerate(named):
                values = self.base[(layer, name)].copy()
                if weight is None:
                    values *= 10 ** self.scales[(layer, name)][event]
                    if self.peaks[event]:
                        values[0] *= 30
                tensor_content = dict(content, role=role, index=i, shape=[len(values)])
                if weight is not None:
                    tensor_content["weight"] = weight
                found += events.tensor_records(
                    layer,
                    name,
                    np.zeros((1, 3)),
                    summaries.stats_vector(values),
                    dict(tensor_content, dtype="float32"),
                )
            for weight in weights:
                if event == 0 or self.rng.random() < 0.01:  # no update record
                    continue
                ratio = 10 ** self.scales[(layer, weight)][event]
                update = summaries.update_vector(10.0, 10.0 * ratio * interval, interval)
                update_content = dict(
                    content,
                    weight=weight,
                    tensor=records.weight_tensor_name(records.WEIGHT, weight),
                )
                found += events.update_records(layer, weight, update, update_content)
        return found


def _loss_scale(batches, applied):
    content = {"kind": metadata.KIND_LOSS_SCALE, "fields": list(LOSS_SCALE_FIELDS)}
    vector = np.array([2.0**15, 3.0, 2000.0, 2.0**15, batches, applied])
    summary_metadata = metadata.create_summary_metadata(content, plugin_name=digest.PLUGIN_NAME)
    return [(f"{digest.TAG_PREFIX}/loss_scale", vector, summary_metadata)]


def _with_missing_count(event_records):
    """The event's records with its digest given, one tensor's count in it missing (NaN)."""
    ((tag, vector, summary_metadata),) = digest.digest_records(event_records)
    rows = metadata.parse_plugin_metadata(summary_metadata.plugin_data.content)["rows"]
    offsets, _ = digest.row_offsets(rows)
    vector = vector.copy()
    row = next(i for i, (kind, _, _) in enumerate(rows) if kind == digest.TENSOR)
    vector[offsets[row] + digest.TENSOR_FIELDS.index("count")] = np.nan
    return [*event_records, (tag, vector, summary_metadata)]


def _from_scratch():
    """A judge whose every event's columns are built anew from the events held."""
    judge = judgement.Judge(warnings=True)
    judge._history.current = lambda key, held: False
    return judge


def test_the_history_s_warnings_are_those_of_the_columns_built_anew_with_resets_and_gaps():
    count = 1200
    run = Run(0, count)
    kept, anew = judgement.Judge(warnings=True), _from_scratch()
    kept_history = kept._history.warnings
    from_history = []

    def counted():
        from_history.append(True)
        return kept_history()

    kept._history.warnings = counted
    step, batches, applied = 0, 0.0, 0.0
    raised = []
    for event in range(count):
        gap = int(run.rng.choice([1, 1, 1, 2, 3]))
        if run.rng.random() < 0.006:
            gap = int(run.rng.choice([150, 260]))
        if event in (500, 900):  # a model trained anew: the steps go back
            gap = 20 - step
        step += gap
        event_records = run.records(event, max(gap, 1))
        if event in (150, 151, 1000):  # one layer left out: another digest layout
            event_records = [r for r in event_records if "/dense/" not in r[0]]
        if 300 <= event < 700 and run.rng.random() < 0.98:
            batches += max(gap, 1)
            applied += max(gap, 1) - (run.rng.random() < 0.1)
            event_records += _loss_scale(batches, applied)
        if event in (350, 800):
            event_records = _with_missing_count(event_records)
        judged = kept.judge(step, event_records).raised
        assert judged == anew.judge(step, event_records).raised, (event, step)
        raised += judged
    kinds = {entry["flag"] for entry in raised if entry["class"] == "warning"}
    assert kinds >= set(leading.WARNINGS) - {"update_spike"}, kinds
    # Most events were judged from the history, the others (another layout or a missing value
    # held, a loss-scale record held but not in the event) from their columns built anew.
    assert count / 2 < len(from_history) < count * 0.9


@pytest.mark.parametrize("finite, raised", [(2, False), (3, True)])
def test_a_window_of_fewer_than_3_values_is_not_judged_whether_its_step_is_judged_alone_or_not(
    monkeypatch, finite, raised
):
    # The callback judges its last event alone (its window counted directly), the board every
    # step (running counts): a window of 2 values judges nothing either way, one of 3 does.
    steps = np.arange(120)
    logs = np.full((1, 120), np.nan)
    logs[0, 119 - np.arange(1, finite + 1) * 10] = 0.0
    logs[0, 119] = 2.0
    rules = (
        lambda at: windows.median_exceeds(steps, logs, 1.0, at),
        lambda at: windows.drift_exceeds(steps, logs, 1.0, 0.005, at),
    )
    for rule in rules:
        alone = rule([119])
        assert alone[0, 119] == raised
        monkeypatch.setattr(windows, "FEW", -1)
        np.testing.assert_array_equal(alone, rule(None) & (steps == 119))
        monkeypatch.undo()
