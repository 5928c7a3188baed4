"""The precision table of `tb-gradviz summary` and the precision fields of `export`.

Per tensor with a precision record (`/step`'s `precision`), the share of its
finite non-zero values that a cast would flush to zero, make subnormal or
overflow, in percent, worded once here for both commands.
"""

from tb_gradviz.format import precision

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
