"""Block-scaled headroom: what the board makes of the precision record's block part. Numpy only.

Two decisions, both over the shares of a tensor's finite non-zero values
(the precision record's `finite_nonzero`), as captured (gradients at the
run's loss scale, as the record holds them):

* a tensor **survives** a block format (`survives`) when at most `SHARE` of
  its finite non-zero values become zero in it: the `block_underflow` rule,
  in each format (`tb-gradviz summary`'s block table shows it per layer's
  gradients, with the share that saturates beside it). Saturation is not
  counted against it: the MX scale (OCP v1.0) puts a block's largest value
  up to `2**(emax + 1)`, past the element's largest whenever that value's
  significand is large, and the clamp errs by at most that ratio (E4M3: 512
  to 448); the share grows with the blocks' few non-zero values (a last
  axis of 3 channels: one value in three), not with the gradient's range;
* the `block_underflow` flag: more than `SHARE` of a gradient's (input,
  output or weight gradient) finite non-zero values become zero in MXFP8
  E4M3 (`FLAG_FORMAT`), the format NVIDIA Transformer Engine's MXFP8 recipe
  casts every tensor to. It reads one count per tensor, which the per-event
  digest holds (`digest.BLOCK_FIELD`), so every logged step is judged.

The values of a block holding a NaN or an Inf are counted in neither share
(they are in `finite_nonzero`): such a tensor is flagged `nonfinite`. A
tensor without the block part (a run written before it) is not judged.
"""

import numpy as np

from tb_gradviz.format import blocks, digest, origin

SHARE = 0.01
FLAG_FORMAT = digest.BLOCK_FORMAT
FLAGS = ("block_underflow",)
SHARES = ("to_zero", "saturated")
# The counts `tensor_headroom` gives as shares of a tensor's finite non-zero values.
VALUE_SHARES = ("to_zero", "subnormal", "saturated")


def rules():
    """The rule of each flag, as the tab shows it on hover."""
    return {
        "block_underflow": f"over {SHARE:.0%} of a gradient's non-zero values become zero in "
        "MXFP8 E4M3 (blocks of 32 values along the last axis, one power-of-two scale each: "
        "Transformer Engine's MXFP8 recipe), as captured"
    }


def shares(record, name):
    """`{"to_zero", "saturated"}`: the shares of a decoded precision record's finite non-zero
    values that become zero / saturate in block format `name`, or None when the record has no
    block part or no finite non-zero value."""
    found = record.get("block_formats") if record else None
    n = record["finite_nonzero"] if record else 0
    if found is None or not n:
        return None
    return {share: found[name][share] / n for share in SHARES}


def survives(found):
    """Whether `shares` survive: at most `SHARE` become zero (None for None)."""
    return None if found is None else found["to_zero"] <= SHARE


def tensor_headroom(record):
    """What each block format does to one tensor, as `/step` serves it beside its precision
    record (the tab's precision panel words it; it computes nothing).

    Returns:
      `{format: {"to_zero", "subnormal", "saturated", "wide_blocks", "relative_error",
      "survives"}}` for every format of `blocks.FORMATS`: the first three are shares of the
      record's finite non-zero values, `wide_blocks` a share of the tensor's blocks of the
      format's size, `relative_error` the record's, and `survives` this module's rule
      (`survives(shares(...))`); a share is None where there is nothing to divide by (no finite
      non-zero value, no block), and `survives` is None without a finite non-zero value. None
      for a record without the block part (written before it) or no record.
    """
    found = record.get("block_formats") if record else None
    if found is None:
        return None
    total = record["finite_nonzero"]
    result = {}
    for name in blocks.FORMATS:
        counts = found[name]
        result[name] = {
            **{count: counts[count] / total if total else None for count in VALUE_SHARES},
            "wide_blocks": counts["wide_blocks"] / counts["blocks"] if counts["blocks"] else None,
            "relative_error": counts["relative_error"],
            "survives": survives(shares(record, name)),
        }
    return result


def role_share(layer, role):
    """The share of one role's finite non-zero values in a layer's columns (`health`) that
    become zero in MXFP8 E4M3 (`FLAG_FORMAT`), all its tensors of that role pooled: what
    `/timeline`'s `block_zero_share` shows, from the digest's count (`digest.BLOCK_FIELD`).

    Returns:
      `[steps]` shares, NaN at a step where a tensor of the role has no block part or none of
      their values is finite and non-zero; None when the layer has no tensor of `role` or one
      of them has no precision row (a run written before the record).
    """
    tensors = [name for name, entry in layer["tensors"].items() if entry["role"] == role]
    precision = layer.get("precision", {})
    if not tensors or any(name not in precision for name in tensors):
        return None
    total = np.sum([precision[name]["finite_nonzero"] for name in tensors], axis=0)
    count = np.sum([_count(precision[name]) for name in tensors], axis=0)
    return _share({"finite_nonzero": total, digest.BLOCK_FIELD: count})


def layer_survival(tensors):
    """Per block format, a layer's gradients together: `{format: {"survives", "to_zero",
    "saturated"}}` with each share the largest of its gradients' (`shares`), or None when no
    gradient of the layer has a block part.

    Args:
      tensors: `/step`'s tensors of one layer: `{name: {"role", "precision", ...}}`.
    """
    judged = [
        tensors[name]["precision"]
        for name in origin.in_layer(tensors, origin.BACKWARD_ROLES)
        if shares(tensors[name].get("precision"), FLAG_FORMAT) is not None
    ]
    if not judged:
        return None
    result = {}
    for name in blocks.FORMATS:
        found = [shares(record, name) for record in judged]
        worst = {share: max(f[share] for f in found) for share in SHARES}
        result[name] = dict(worst, survives=survives(worst))
    return result


def _judged(layer):
    """`[(tensor, precision columns)]`: a layer's gradients with a precision row, in the order
    the backward pass computes them."""
    precision = layer.get("precision", {})
    return [
        (tensor, precision[tensor])
        for tensor in origin.in_layer(layer["tensors"], origin.BACKWARD_ROLES)
        if tensor in precision
    ]


def _count(columns):
    """`[steps]` count of a tensor's values that MXFP8 E4M3 turns to zero (NaN without it)."""
    total = columns["finite_nonzero"]
    return columns.get(digest.BLOCK_FIELD, np.full(np.shape(total), np.nan))


def _share(columns):
    """`[steps]` share of a tensor's finite non-zero values that MXFP8 E4M3 turns to zero (NaN
    where the record has no block part or no such value)."""
    total = columns["finite_nonzero"]
    count = _count(columns)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, count / np.where(total > 0, total, 1), np.nan)


def verdicts(layers, steps):
    """`{"block_underflow"}`: `[layers, steps]` booleans of `health`'s layer columns."""
    found = np.zeros((len(layers), steps), bool)
    judged = [(i, columns) for i, layer in enumerate(layers) for _, columns in _judged(layer)]
    if judged:  # every judged gradient's share at once: `[gradients, steps]`
        index, shares = zip(*judged)
        stacked = {
            "finite_nonzero": np.array([columns["finite_nonzero"] for columns in shares]),
            digest.BLOCK_FIELD: np.array([_count(columns) for columns in shares], np.float64),
        }
        with np.errstate(invalid="ignore"):
            share = _share(stacked).reshape(len(index), steps)
            np.logical_or.at(found, np.array(index), share > SHARE)
    return {"block_underflow": found}


def flag_entries(layer, found, index, step):
    """The `block_underflow` flag of one layer at one step of judged columns:
    `[{"flag", "detail", "tensor", "tensors"}]` (`tensor`: the first gradient flagged in the
    order the backward pass computes them; `tensors`: all of them)."""
    if not found["block_underflow"][index, step]:
        return []
    hits = []
    for tensor, columns in _judged(layer):
        share = _share(columns)[step]
        if share > SHARE:
            n = int(columns["finite_nonzero"][step])
            zeros = int(columns[digest.BLOCK_FIELD][step])
            hits.append(
                (
                    tensor,
                    f"{tensor}: {share:.1%} of {n} non-zero values become zero in MXFP8 "
                    f"E4M3 ({zeros})",
                )
            )
    return [
        {
            "flag": "block_underflow",
            "detail": "; ".join(detail for _, detail in hits),
            "tensor": hits[0][0],
            "tensors": [tensor for tensor, _ in hits],
        }
    ]
