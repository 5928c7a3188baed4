"""Precision headroom: what the board makes of the precision records. Numpy only.

`/step` serves each tensor's precision record as `records.decode_precision`
gives it, and the two flags decided here (the tab, `tb-gradviz check` and
`summary` show them as they are):

* `underflow`: more than `UNDERFLOW_SHARE` of a gradient's finite, non-zero
  values underflow (flush to zero or become subnormal: IEEE underflow) in the
  format the layer computes in, at the run's loss scale;
* `overflow`: a gradient whose values are held in or cast to float16 or
  bfloat16 (`cast_format`) holds values that overflow there at the run's
  loss scale: ±Inf (what a float16 gradient holds once its backward pass
  overflowed, since the cast's result is Inf) or finite values beyond the
  format's largest (what a cast of a wider tensor to it would make Inf).

"The format the layer computes in" is the layer's compute dtype when it is
float16 or bfloat16 (`mixed_float16`, `mixed_bfloat16` and the like); a
float32 layer is not judged, since nothing it holds would be cast. The
gradients are the values the backward pass held, loss-scaled as the train
step scales them (FORMAT.md, the precision record). A gradient already in
float16 holds the cast's result: what its backward pass flushed is among
its zeros, and the subnormals that remain say that the loss scale leaves
the gradient at the bottom of float16's range, where the next layer's
backward flushes it. Both count towards the share.

`overflow` judges the values a narrow format holds: a float32 gradient that
is never cast (BatchNormalization's gamma and beta under `mixed_float16`,
which it computes with in float32) holds finite values far beyond float16's
largest at a large loss scale, and nothing overflows; the float16 gradients
that do overflow are ±Inf, which `LossScaleOptimizer` answers by skipping
the step and halving its scale.
"""

import numpy as np

from tb_gradviz.format import digest, origin, precision, records

UNDERFLOW_SHARE = 0.01
FLAGS = ("underflow", "overflow")
COMPUTE_FORMATS = digest.PRECISION_FORMATS


def rules():
    """The rule of each flag, as the tab shows it on hover."""
    return {
        "underflow": f"over {UNDERFLOW_SHARE:.0%} of a gradient's non-zero values underflow "
        "(to zero or subnormal) in the float16 or bfloat16 the layer computes in, "
        "at the run's loss scale",
        "overflow": "a gradient held in or cast to float16 or bfloat16 holds values that "
        "overflow it at the run's loss scale (±Inf, or finite values past its largest): "
        "lower the loss scale",
    }


def compute_format(layer_dtype):
    """The precision format a layer computes in (one of `precision.FORMATS`), or None (float32)."""
    return layer_dtype if layer_dtype in COMPUTE_FORMATS else None


def cast_format(content, layer_dtype):
    """The format (float16 or bfloat16) a recorded tensor's values are held in or cast to where
    its layer computes, or None: the tensors the `overflow` rule judges.

    Args:
      content: the tensor's metadata (`dtype`, `role`, and for a weight tensor
        `compute_dtype`, the dtype its layer computes with the weight in).
      layer_dtype: the layer's compute dtype.

    A float16 or bfloat16 tensor is held in its own format. A weight or weight
    gradient is cast when its layer computes with the weight in such a format
    (a Dense kernel under `mixed_float16`, read in float16; never
    BatchNormalization's gamma, read in float32); a run written before
    `compute_dtype` does not say, and its float32 weight tensors are not
    judged. Any other tensor is cast where its layer computes in such a format.
    """
    dtype = content.get("dtype")
    if dtype in COMPUTE_FORMATS:
        return dtype
    if content.get("role") in records.WEIGHT_ROLES:
        return compute_format(content.get("compute_dtype"))
    return compute_format(layer_dtype)


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
    """A decoded precision record as the digest's precision fields (`[1]` arrays); the block
    count NaN for a record without the block part."""
    blocks = record.get("block_formats")
    values = [record["finite_nonzero"]] + [
        record["formats"][name]["as_is"][count]
        for name in digest.PRECISION_FORMATS
        for count in precision.COUNTS
    ]
    values.append(np.nan if blocks is None else blocks[digest.BLOCK_FORMAT]["to_zero"])
    return {field: np.array([float(v)]) for field, v in zip(digest.PRECISION_FIELDS, values)}


def _judged(layer):
    """`(format, [(tensor, precision columns)])`: the gradients of a layer that are judged, in
    the order the backward pass computes them (`origin.in_layer`)."""
    name = compute_format(layer.get("layer_dtype"))
    if name is None:
        return None, []
    precision = layer.get("precision", {})
    return name, [
        (tensor, precision[tensor])
        for tensor in origin.in_layer(layer["tensors"], origin.BACKWARD_ROLES)
        if tensor in precision
    ]


def flushed(precisions, name):
    """`(flushed, total, share)` `[steps]` arrays: of the finite non-zero values of these
    precision columns, all pooled (`total`), those a cast to format `name` flushes to zero or
    makes subnormal (`flushed`: IEEE underflow, as the values are), and their share (NaN where
    `total` is 0). The one definition of the share that flushes to zero: the `underflow` flag's
    and the one `/step` and `/timeline` serve as `flush_share`."""
    flushed_count = np.sum([p[f"{name}_to_zero"] + p[f"{name}_subnormal"] for p in precisions], 0)
    total = np.sum([p["finite_nonzero"] for p in precisions], axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(total > 0, flushed_count / np.where(total > 0, total, 1), np.nan)
    return flushed_count, total, share


def flush_format(layer_dtype):
    """The format a layer's flush share is taken in: the one it computes in, else float16 (what
    a float32 layer would meet under `mixed_float16`)."""
    return compute_format(layer_dtype) or "float16"


def flush_share(layer, role):
    """The share of one role's finite non-zero values in a layer's columns (`health`) that
    flush to zero in the layer's `flush_format`, all its tensors of that role pooled.

    Returns:
      `{"format", "computes", "flushed", "total", "share"}` with `[steps]` arrays (`computes`:
      whether the layer computes in that format), or None when the layer has no tensor of
      `role` or one of them has no precision record (a run written before it).
    """
    tensors = [name for name, entry in layer["tensors"].items() if entry["role"] == role]
    precision = layer.get("precision", {})
    if not tensors or any(name not in precision for name in tensors):
        return None
    name = flush_format(layer.get("layer_dtype"))
    count, total, share = flushed([precision[tensor] for tensor in tensors], name)
    return {
        "format": name,
        "computes": compute_format(layer.get("layer_dtype")) is not None,
        "flushed": count,
        "total": total,
        "share": share,
    }


def flush_shares(layer, step=0):
    """`{role: {"share", "format", "computes", "flushed", "total"} or None}` at one step of a
    layer's columns, for each role it has tensors of (`records.ROLES` order): `flush_share` as
    `/step` serves it (counts as ints, the share NaN when no value is finite and non-zero)."""
    roles = [r for r in records.ROLES if any(t["role"] == r for t in layer["tensors"].values())]
    result = {}
    for role in roles:
        found = flush_share(layer, role)
        if found is not None and not np.isfinite(found["total"][step]):
            found = None  # no precision row at this step
        result[role] = found and {
            "share": float(found["share"][step]),
            "format": found["format"],
            "computes": found["computes"],
            "flushed": int(found["flushed"][step]),
            "total": int(found["total"][step]),
        }
    return result


def _tensor_verdicts(columns, name):
    """`(underflow share, underflow)`: `[steps]` arrays of precision columns."""
    _, _, underflow = flushed([columns], name)
    with np.errstate(invalid="ignore"):
        return underflow, underflow > UNDERFLOW_SHARE


def _overflow_judged(layer):
    """`[(tensor, format, tensor columns, precision columns)]`: the gradients of a layer that the
    `overflow` rule judges, in the order the backward pass computes them: those with a precision
    record whose values are held in or cast to a narrow format (the layer's `formats`, by
    `cast_format`; columns without them judge none)."""
    tensors, precision = layer["tensors"], layer.get("precision", {})
    formats = layer.get("formats", {})
    return [
        (tensor, formats[tensor], tensors[tensor], precision[tensor])
        for tensor in origin.in_layer(tensors, origin.BACKWARD_ROLES)
        if tensor in precision and formats.get(tensor) in COMPUTE_FORMATS
    ]


def _overflows(tensor, columns, name):
    """`(infinite, beyond)`: `[steps]` arrays of a judged tensor's values that overflow format
    `name`, those already ±Inf (a float16 value whose computation overflowed) and the finite
    ones past the format's largest (a wider value that the cast makes Inf)."""
    return tensor["pos_inf"] + tensor["neg_inf"], columns[f"{name}_overflow"]


def verdicts(layers, steps):
    """`{"underflow", "overflow"}`: `[layers, steps]` booleans of `health`'s layer columns."""
    found = {flag: np.zeros((len(layers), steps), bool) for flag in FLAGS}
    for i, layer in enumerate(layers):
        name, judged = _judged(layer)
        for _, columns in judged:
            found["underflow"][i] |= _tensor_verdicts(columns, name)[1]
        for _, name, tensor, columns in _overflow_judged(layer):
            infinite, beyond = _overflows(tensor, columns, name)
            with np.errstate(invalid="ignore"):
                found["overflow"][i] |= infinite + beyond > 0
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
        share, underflow = _tensor_verdicts(columns, name)
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
    for tensor, cast, values, columns in _overflow_judged(layer):
        infinite, beyond = (int(np.nan_to_num(a[step])) for a in _overflows(values, columns, cast))
        if infinite + beyond:
            parts = [f"{infinite} ±Inf"] if infinite else []
            if beyond:
                parts.append(f"{beyond} finite past {precision.largest(cast):g}")
            count = int(values["count"][step])
            hits["overflow"].append(
                (
                    tensor,
                    f"{tensor}: {infinite + beyond} of {count} values overflow {cast} "
                    f"({', '.join(parts)})",
                )
            )
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
    tensor's `role`, `format` (`cast_format`), `stats` (its `pos_inf`, `neg_inf` and `count`) and
    decoded `precision`, None when not recorded), as `flag_entries` gives them."""
    tensors = layer["tensors"]
    columns = {
        "layer_dtype": layer.get("layer_dtype"),
        "tensors": {
            tensor: dict(
                {
                    field: np.array([float(entry.get("stats", {}).get(field, 0))])
                    for field in ("count", "pos_inf", "neg_inf")
                },
                role=entry["role"],
            )
            for tensor, entry in tensors.items()
        },
        "formats": {tensor: entry.get("format") for tensor, entry in tensors.items()},
        "precision": {
            tensor: precision_columns(entry["precision"])
            for tensor, entry in layer["tensors"].items()
            if entry.get("precision")
        },
    }
    return flag_entries(columns, verdicts([columns], 1), 0, 0)
