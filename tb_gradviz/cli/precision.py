"""The precision tables of `tb-gradviz summary` and the precision fields of `export`.

Per tensor with a precision record (`/step`'s `precision`), the share of its
finite non-zero values that a cast would flush to zero, make subnormal or
overflow, in percent, worded once here for both commands; and per layer, the
block-scaled formats its gradients survive (`block_headroom.layer_survival`).
"""

from tb_gradviz.format import block_headroom, blocks, precision, records

PRECISION_COLUMNS = (
    "layer",
    "tensor",
    "non-zero",
    *precision.FORMATS,
    *(f"{name} scaled" for name in precision.FORMATS if name.startswith("float8")),
)


def percent(count, total):
    """A share of `total` in percent, to two decimals ("-" when `total` is 0)."""
    return "-" if not total else f"{100.0 * count / total:.2f}"


def cell(record, name, setting):
    """`zero/subnormal/overflow` percentages of one format and setting of a decoded record."""
    counts = record["formats"][name][setting]
    total = record["finite_nonzero"]
    return "/".join(percent(counts[key], total) for key in precision.COUNTS)


def precision_rows(snapshot):
    """Rows of the precision table of one run at one step (empty for a run without records)."""
    rows = []
    for layer in snapshot["layers"]:
        for tensor, entry in layer["tensors"].items():
            record = entry.get("precision")
            if not record:
                continue
            rows.append(
                (
                    layer["layer"],
                    tensor,
                    str(record["finite_nonzero"]),
                    *(cell(record, name, "as_is") for name in precision.FORMATS),
                    *(
                        cell(record, name, "scaled")
                        for name in precision.FORMATS
                        if name.startswith("float8")
                    ),
                )
            )
    return rows


BLOCK_COLUMNS = ("layer", "gradients", *blocks.FORMATS)


def block_cell(survival):
    """`ok` when it survives, else `z<% to zero>`; then ` s<% saturated>` when over the share."""
    cell = "ok" if survival["survives"] else f"z{100.0 * survival['to_zero']:.2f}"
    if survival["saturated"] > block_headroom.SHARE:
        cell += f" s{100.0 * survival['saturated']:.2f}"
    return cell


def block_rows(snapshot):
    """Rows of the block-format table of one run at one step: per layer whose gradients have
    the block part, how many gradients, and per block format `block_cell` of their survival."""
    rows = []
    for layer in snapshot["layers"]:
        survival = block_headroom.layer_survival(layer["tensors"])
        if survival is None:
            continue
        judged = sum(
            block_headroom.shares(entry.get("precision"), block_headroom.FLAG_FORMAT) is not None
            for entry in layer["tensors"].values()
            if entry["role"] in records.GRADIENT_ROLES
        )
        rows.append(
            (layer["layer"], str(judged), *(block_cell(survival[name]) for name in blocks.FORMATS))
        )
    return rows
