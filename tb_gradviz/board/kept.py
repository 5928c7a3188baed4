"""Which logged steps of a run have full records, and which only the digest.

The callback writes the digest at every log event and the full records
(histograms, stats, ...) at the events its schedule names and around each
flag's onset (`format/full_records.py`). `summary`, `export` and the tab say
which steps have them, from the steps of the series themselves: the logged
steps are the digest's, the steps with full records the stats series'. A
run written before the digest has no digest-only step. Numpy only.
"""

import numpy as np

from tb_gradviz.board import catalog, columns

# At most this many groups of steps are named in a line; the rest are counted.
SHOWN_GROUPS = 24


def full_record_steps(run_store, layers):
    """`{"logged": [steps], "full": [steps]}` of a run: every logged step (its digest's, or its
    full records' in a run without a digest) and those with full records, sorted.

    Args:
      run_store: the run's `store.RunStore`.
      layers: its layer index (`RunStore.layers()`).

    TensorBoard may keep a sample of a long run's full records (the digest
    is kept whole): the steps are those the reader holds.
    """
    stats = catalog.listed_by_kind(layers)["stats"]
    read = run_store.read(stats, catalog.KINDS["stats"][1]) if stats else {}
    full = np.unique(np.concatenate([s.steps for s in read.values()] or [np.zeros(0, np.int64)]))
    digests = columns.read_digests(run_store)
    logged = np.unique(
        np.concatenate([s.steps for s in digests] + [full]).astype(np.int64, copy=False)
    )
    return {"logged": logged.tolist(), "full": full.astype(np.int64).tolist()}


def groups(steps):
    """`[(first, last)]`: runs of consecutive steps among `steps` (sorted ints)."""
    found = []
    for step in steps:
        if found and step == found[-1][1] + 1:
            found[-1] = (found[-1][0], step)
        else:
            found.append((step, step))
    return found


def describe(steps, shown=SHOWN_GROUPS):
    """`steps` as text: `"1-5, 7, 10"`, the middle groups counted past `shown` of them."""

    def text(group):
        first, last = group
        return str(first) if first == last else f"{first}-{last}"

    found = groups(steps)
    if len(found) <= shown:
        return ", ".join(map(text, found))
    head, tail = found[: shown // 2], found[-(shown - shown // 2) :]
    hidden = sum(last - first + 1 for first, last in found[len(head) : len(found) - len(tail)])
    return ", ".join(
        [
            *map(text, head),
            f"... {hidden} more step{'s' if hidden > 1 else ''} ...",
            *map(text, tail),
        ]
    )


def line(kept):
    """The `summary` line of `full_record_steps`' result."""
    logged, full = kept["logged"], kept["full"]
    return (
        f"full records at {len(full)} of {len(logged)} logged steps: {describe(full)}; "
        "the others have the digest only (each record's latest earlier step is shown)"
    )
