"""A record's layout: its shape now, the lengths it had before, and which of its values count.

`records` defines each record's layout with this class; readers upgrade what
they read with it and leave out rows whose counts are malformed. Imports
only numpy.
"""

import numpy as np


class Layout:
    """One record's layout: its shape now, the lengths it had before, which values count.

    Args:
      name: the record's name in messages.
      shape: the shape of a record written now.
      count_columns: a function of an `[n, *shape]` array returning the part
        that counts elements; a row where any of it is not a finite,
        non-negative number is malformed.
      earlier_lengths: lengths of a vector record in earlier layouts (fields
        were appended since); such records are padded with NaN.
    """

    def __init__(self, name, shape, count_columns, earlier_lengths=()):
        self.name = name
        self.shape = shape
        self._count_columns = count_columns
        self.earlier_lengths = frozenset(earlier_lengths)

    def upgrade(self, array):
        """Returns a record in today's layout, or None if it has no known layout.

        A record of an earlier layout gets NaN for the fields added since.
        """
        array = np.asarray(array, dtype=np.float64)
        if array.shape == self.shape:
            return array
        if array.ndim == 1 and array.size in self.earlier_lengths:
            return np.concatenate([array, np.full(self.shape[0] - array.size, np.nan)])
        return None

    def valid_rows(self, values):
        """Returns which rows of `[n, *shape]` records have whole, non-negative counts."""
        counts = self._count_columns(values).reshape(len(values), -1)
        return np.all(np.isfinite(counts) & (counts >= 0), axis=1)


def upgraded(layout, vector):
    """One vector record in `layout`'s shape today (`Layout.upgrade`).

    Raises:
      ValueError: the vector has none of the layout's lengths.
    """
    found = layout.upgrade(np.asarray(vector, dtype=np.float64).ravel())
    if found is None:
        raise ValueError(
            f"a {layout.name} record has {layout.shape[0]} values (or "
            f"{sorted(layout.earlier_lengths)} in earlier layouts); received {np.size(vector)}"
        )
    return found
