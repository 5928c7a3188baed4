"""Precision headroom: what the board makes of the precision records. Numpy only.

`/step` serves each tensor's precision record as `records.decode_precision`
gives it, and the two flags decided here (the tab, `tb-gradviz check` and
`summary` show them as they are):

* `underflow`: more than `UNDERFLOW_SHARE` of a gradient's finite, non-zero
  values underflow (flush to zero or become subnormal: IEEE underflow) in the
  format the layer computes in, at the run's loss scale;
* `overflow`: more than `OVERFLOW_SHARE` of them overflow there.

"The format the layer computes in" is the layer's compute dtype when it is
float16 or bfloat16 (`mixed_float16`, `mixed_bfloat16` and the like); a
float32 layer is not judged, since nothing it holds would be cast. The
gradients are the values the backward pass held, loss-scaled as the train
step scales them (FORMAT.md, the precision record). A gradient already in
float16 holds the cast's result: what its backward pass flushed is among
its zeros, and the subnormals that remain say that the loss scale leaves
the gradient at the bottom of float16's range, where the next layer's
backward flushes it. Both count towards the share.
"""

import numpy as np

from tb_gradviz.format import digest, precision, records

UNDERFLOW_SHARE = 0.01
OVERFLOW_SHARE = 0.0
FLAGS = ("underflow", "overflow")
COMPUTE_FORMATS = digest.PRECISION_FORMATS


def rules():
    """The rule of each flag, as the tab shows it on hover."""
    return {
        "underflow": f"over {UNDERFLOW_SHARE:.0%} of a gradient's non-zero values underflow "
        "(to zero or subnormal) in the float16 or bfloat16 the layer computes in, "
        "at the run's loss scale",
        "overflow": "a gradient holds values that overflow the float16 or bfloat16 the layer "
        "computes in, at the run's loss scale",
    }


def compute_format(layer_dtype):
    """The precision format a layer computes in (one of `precision.FORMATS`), or None (float32)."""
    return layer_dtype if layer_dtype in COMPUTE_FORMATS else None


def shares(record, name, setting="as_is"):
    """`{"to_zero", "subnormal", "underflow", "overflow"}`: the shares of a decoded precision
    record's finite non-zero values (NaN when it has none) in one format and setting."""
    counts = record["formats"][name][setting]
    n = record["finite_nonzero"]
    if not n:
        return {key: float("nan") for key in ("to_zero", "subnormal", "underflow", "overflow")}
    return {
        "to_zero": counts["to_zero"] / n,
        "subnormal": counts["subnormal"] / n,
        "underflow": (counts["to_zero"] + counts["subnormal"]) / n,
        "overflow": counts["overflow"] / n,
    }


def precision_columns(record):
    """A decoded precision record as the digest's precision fields (`[1]` arrays)."""
    values = [record["finite_nonzero"]] + [
        record["formats"][name]["as_is"][count]
        for name in digest.PRECISION_FORMATS
        for count in precision.COUNTS
    ]
    return {field: np.array([float(v)]) for field, v in zip(digest.PRECISION_FIELDS, values)}


def _judged(layer):
    """`(format, [(tensor, precision columns)])`: the gradients of a layer that are judged."""
    name = compute_format(layer.get("layer_dtype"))
    if name is None:
        return None, []
    precision = layer.get("precision", {})
    return name, [
        (tensor, precision[tensor])
        for tensor, entry in layer["tensors"].items()
        if entry["role"] in records.GRADIENT_ROLES and tensor in precision
    ]


def _tensor_verdicts(columns, name):
    """`(underflow share, underflow, overflow)`: `[steps]` arrays of precision columns."""
    n = columns["finite_nonzero"]
    with np.errstate(invalid="ignore", divide="ignore"):
        n_or_nan = np.where(n > 0, n, np.nan)
        underflow = (columns[f"{name}_to_zero"] + columns[f"{name}_subnormal"]) / n_or_nan
        overflow = columns[f"{name}_overflow"] / n_or_nan
        return underflow, underflow > UNDERFLOW_SHARE, overflow > OVERFLOW_SHARE


def verdicts(layers, steps):
    """`{"underflow", "overflow"}`: `[layers, steps]` booleans of `health`'s layer columns."""
    found = {flag: np.zeros((len(layers), steps), bool) for flag in FLAGS}
    for i, layer in enumerate(layers):
        name, judged = _judged(layer)
        for _, columns in judged:
            _, underflow, overflow = _tensor_verdicts(columns, name)
            found["underflow"][i] |= underflow
            found["overflow"][i] |= overflow
    return found


def flag_entries(layer, found, index, step):
    """The underflow and overflow flags of one layer at one step of judged columns:
    `[{"flag", "detail", "tensor", "tensors"}]` (`tensor`: the first gradient flagged; `tensors`:
    all of them)."""
    if not (found["underflow"][index, step] or found["overflow"][index, step]):
        return []
    name, judged = _judged(layer)
    hits = {flag: [] for flag in FLAGS}
    for tensor, columns in judged:
        share, underflow, overflow = _tensor_verdicts(columns, name)
        n = int(columns["finite_nonzero"][step])
        if underflow[step]:
            to_zero = int(columns[f"{name}_to_zero"][step])
            subnormal = int(columns[f"{name}_subnormal"][step])
            hits["underflow"].append(
                (
                    tensor,
                    f"{tensor}: {share[step]:.1%} of {n} non-zero values underflow in "
                    f"{name} ({to_zero} to zero, {subnormal} subnormal)",
                )
            )
        if overflow[step]:
            count = int(columns[f"{name}_overflow"][step])
            hits["overflow"].append((tensor, f"{tensor}: {count} of {n} values overflow {name}"))
    return [
        {
            "flag": flag,
            "detail": "; ".join(d for _, d in found_hits),
            "tensor": found_hits[0][0],
            "tensors": [t for t, _ in found_hits],
        }
        for flag, found_hits in hits.items()
        if found_hits
    ]


def flags(layer):
    """The `underflow` and `overflow` flags of one `/step` layer (with `layer_dtype` and each
    tensor's decoded `precision`, None when not recorded), as `flag_entries` gives them."""
    columns = {
        "layer_dtype": layer.get("layer_dtype"),
        "tensors": layer["tensors"],
        "precision": {
            tensor: precision_columns(entry["precision"])
            for tensor, entry in layer["tensors"].items()
            if entry.get("precision")
        },
    }
    return flag_entries(columns, verdicts([columns], 1), 0, 0)
