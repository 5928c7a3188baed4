"""A layer's flow per role: the RMS, largest magnitude and zero fraction of its tensors of one
role (activation, output gradient, input gradient) together, from their digest columns.

The flags read the output gradients' RMS of every layer (`health.verdicts`), the board each
layer's flow at a step (`/onset`, `/step`, `/timeline`).

Numpy only.
"""

import numpy as np

from tb_gradviz.format import records

_ROLE_FIELDS = ("count", "nan", "pos_inf", "neg_inf", "rms", "max_abs", "zeros")
_FLOW = ("rms", "max_abs", "zero_fraction")


def role_columns(tensors, role):
    """`{"rms", "max_abs", "zero_fraction"}` `[steps]` arrays over one role's tensors, or None.

    RMS and max are over the finite values (NaN when there is none); the
    RMS of several tensors is that of all their values together.
    """
    if not any(t["role"] == role for t in tensors.values()):
        return None
    return {name: column[0] for name, column in layers_role_columns([tensors], role).items()}


def layers_role_columns(layer_tensors, role, steps=0):
    """`role_columns` of each layer's tensors at once: `{"rms", "max_abs", "zero_fraction"}`
    `[layers, steps]` arrays, NaN for a layer without a tensor of that role (`steps`: their
    length when no layer has one)."""
    chosen, layer_of = [], []
    for i, tensors in enumerate(layer_tensors):
        for t in tensors.values():
            if t["role"] == role:
                chosen.append(t)
                layer_of.append(i)
    if not chosen:
        return {name: np.full((len(layer_tensors), steps), np.nan) for name in _FLOW}
    # [fields, tensors, steps], one array for the role's seven columns; the tensors of a layer
    # are consecutive, so each layer's sums are one segment's (`reduceat` at its first).
    count, nan, pos_inf, neg_inf, rms, max_abs, zeros = np.array(
        [[t[field] for t in chosen] for field in _ROLE_FIELDS], np.float64
    ).reshape(len(_ROLE_FIELDS), len(chosen), -1)
    layer_of = np.array(layer_of)
    firsts = np.flatnonzero(np.diff(layer_of, prepend=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        finite = count - nan - pos_inf - neg_inf
        some = finite > 0
        total = np.add.reduceat(np.where(some, finite, 0), firsts, axis=0)
        squares = np.add.reduceat(np.where(some, finite * rms**2, 0), firsts, axis=0)
        found = {
            "rms": np.where(total > 0, np.sqrt(squares / np.where(total > 0, total, 1)), np.nan),
            "max_abs": np.fmax.reduceat(np.where(some, max_abs, np.nan), firsts, axis=0),
        }
        count = np.add.reduceat(count, firsts, axis=0)
        found["zero_fraction"] = np.where(
            count > 0, np.add.reduceat(zeros, firsts, axis=0) / np.where(count, count, 1), np.nan
        )
    result = {}
    for name, column in found.items():
        result[name] = np.full((len(layer_tensors),) + column.shape[1:], np.nan)
        result[name][layer_of[firsts]] = column
    return result


def layer_flow(layer, step=0):
    """`{role: {"rms", "max_abs", "zero_fraction"}}` of one layer's columns at one step."""
    roles = [
        role for role in records.ROLES if any(t["role"] == role for t in layer["tensors"].values())
    ]
    return {
        role: {k: float(v[step]) for k, v in role_columns(layer["tensors"], role).items()}
        for role in roles
    }
