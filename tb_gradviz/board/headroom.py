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

from tb_gradviz.format import records

UNDERFLOW_SHARE = 0.01
OVERFLOW_SHARE = 0.0
FLAGS = ("underflow", "overflow")
COMPUTE_FORMATS = ("float16", "bfloat16")


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


def flags(layer):
    """The `underflow` and `overflow` flags of one `/step` layer (with `layer_dtype` and each
    tensor's `precision`, None when not recorded): `[{"flag", "detail", "tensor", "tensors"}]`
    (`tensor`: the first gradient flagged; `tensors`: all of them)."""
    name = compute_format(layer.get("layer_dtype"))
    if name is None:
        return []
    found = {flag: [] for flag in FLAGS}
    for tensor, entry in layer["tensors"].items():
        record = entry.get("precision")
        if entry["role"] not in records.GRADIENT_ROLES or not record:
            continue
        share = shares(record, name)
        counts = record["formats"][name]["as_is"]
        n = record["finite_nonzero"]
        if share["underflow"] > UNDERFLOW_SHARE:
            found["underflow"].append(
                (
                    tensor,
                    f"{tensor}: {share['underflow']:.1%} of {n} non-zero values underflow in "
                    f"{name} ({counts['to_zero']} to zero, {counts['subnormal']} subnormal)",
                )
            )
        if share["overflow"] > OVERFLOW_SHARE:
            found["overflow"].append(
                (tensor, f"{tensor}: {counts['overflow']} of {n} values overflow {name}")
            )
    return [
        {
            "flag": flag,
            "detail": "; ".join(d for _, d in hits),
            "tensor": hits[0][0],
            "tensors": [t for t, _ in hits],
        }
        for flag, hits in found.items()
        if hits
    ]
