"""The columns every view of a run over its steps reads: each layer's values at every step.

`/onset`, `/timeline`, `tb-gradviz check` and the digest's part of `/step`
judge and show the same `Columns`, built from the run's per-event digest
by `rule_columns.build` (`digest_columns`), the function the callback
judges its log events with too. A run written before the digest is judged
from its full records step by step (`records_columns`). Numpy only, like
the rest of the board.
"""

import numpy as np

from tb_gradviz.board import snapshot
from tb_gradviz.format import digest, records, rule_columns

Columns = rule_columns.Columns


def digest_layout(rows):
    """The `records.Layout` of a digest with these rows: its length (an earlier digest's
    upgraded), and its counts checked (`digest.DigestLayout`)."""
    return digest.DigestLayout(rows)


def read_digests(run_store):
    """`[rule_columns.DigestSeries]`: every digest series of a `store.RunStore`'s run, read
    whole, its parts joined in step order (`store.RunStore.read_digest`)."""
    found = []
    for tag, listed in run_store.digests().items():
        series = run_store.read_digest(tag, listed, digest_layout(listed.rows))
        found.append(
            rule_columns.DigestSeries(
                listed.rows, series.steps, series.values, listed.update_weights
            )
        )
    return found


def digest_columns(layers, digests, loss_scale=None):
    """The run's `Columns` from its digest series (`rule_columns.build`).

    Args:
      layers: the run's layer index (`store.RunStore.layers()`): which layers
        and tensors there are, their order, roles and compute dtype.
      digests: the run's digest series (`read_digests`).
      loss_scale: the run's `rule_columns.LossScaleSeries`, or None.
    """
    infos = {
        name: rule_columns.LayerInfo(
            layer["info"], [listed.content for listed in layer["tensors"].values()]
        )
        for name, layer in layers.items()
    }
    return rule_columns.build(infos, digests, loss_scale)


def records_columns(layers, series_by_kind):
    """The `Columns` of every logged step from the full records, judged as `/step` judges.

    Args:
      layers: the run's layer index (`store.RunStore.layers()`).
      series_by_kind: every point of the run's series, as for `snapshot.step_body`.

    Returns:
      `(Columns, listed)`: `listed(layer, step)` gives the dead channels the
      units record lists there.
    """
    steps = sorted(
        {int(step) for series in series_by_kind["stats"].values() for step in series.steps}
    )
    at_steps = [snapshot.step_columns(layers, series_by_kind, step) for step in steps]
    if not at_steps:
        return Columns(np.zeros(0, np.int64), []), None
    # Each layer's tensors are all present at the last step: they define the columns.
    _, last = at_steps[-1]
    index = {layer["layer"]: i for i, layer in enumerate(last)}
    columns = [_empty_like(layer, len(steps)) for layer in last]
    listed = {}
    for s, (bodies, at) in enumerate(at_steps):
        for body, layer in zip(bodies, at):
            target = columns[index[layer["layer"]]]
            for name, tensor in layer["tensors"].items():
                for field in digest.TENSOR_FIELDS:
                    target["tensors"][name][field][s] = tensor[field][0]
            for name, fields in layer["precision"].items():
                for field, value in fields.items():
                    target["precision"].setdefault(
                        name, {f: np.full(len(steps), np.nan) for f in digest.PRECISION_FIELDS}
                    )[field][s] = value[0]
            if layer["units"] is not None and target["units"] is not None:
                for field, value in layer["units"].items():
                    target["units"][field][s] = value[0]
                listed[(layer["layer"], steps[s])] = body["units"]["listed"]
    return Columns(np.array(steps), columns), lambda layer, step: listed.get((layer, step))


def _empty_like(layer, steps):
    def nan():
        return np.full(steps, np.nan)

    return {
        "layer": layer["layer"],
        "layer_index": layer["layer_index"],
        "layer_dtype": layer["layer_dtype"],
        "tensors": {
            name: dict({field: nan() for field in digest.TENSOR_FIELDS}, role=tensor["role"])
            for name, tensor in layer["tensors"].items()
        },
        "units": None if layer["units"] is None else {field: nan() for field in layer["units"]},
        "precision": {},
        "formats": layer.get("formats", {}),
        "updates": {},
    }


def listed_dead_channels(run_store, layers):
    """`(layer, step) -> [channel]`: the dead channels a layer's units record lists at that very
    step, or None (no units record there: the digest counts them, the record lists them)."""

    def listed(layer, step):
        units = layers[layer]["units"]
        if units is None:
            return None
        tag, _, time_series = units
        series = run_store.read({tag: time_series}, records.UNITS)[tag]
        row = series.index_at_or_before(step)
        if row is None or int(series.steps[row]) != step:
            return None
        return records.decode_units(series.values[row])["listed"]

    return listed
