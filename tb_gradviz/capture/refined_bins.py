"""The refined magnitude bins of the float32 kernel (kernels.py): its edges, and their cells.

The kernel's magnitude bins are split at every edge it needs: the magnitude
histogram's (`records.LOG_EDGES`) and, with the precision record, each
boundary of the record (`precision_counts.float32_keys`). Each edge is a
float32 key, the bits of the smallest float32 at or above it, so for a
float32 magnitude `|v| >= edge` iff `bits(|v|) >= key`; a value's refined bin
is the number of edges at or below its magnitude, and the counts below any
edge are sums of refined bins.

Imports numba and numpy only.
"""

import numba
import numpy as np

from tb_gradviz.format import records


def float32_key(edge):
    """The bits of the smallest float32 >= `edge`: for a float32 magnitude `|v| >= edge` iff
    `bits(|v|) >= key`."""
    f = np.float32(edge)
    if float(f) < edge:
        f = np.nextafter(f, np.float32(np.inf))
    return int(f.view(np.int32))


LOG_KEYS = np.array([float32_key(edge) for edge in records.LOG_EDGES], np.int64)

# Magnitude cells: the bit patterns of float32 magnitudes in cells of 2**17
# patterns (64 per binary octave), so that a value's refined bin is one load
# and one compare: `cells[a >> CELL_SHIFT]` is `below << 32 | inside`, where
# `below` counts the edges at or below the cell's first pattern and `inside`
# is the one edge inside the cell (or `_NO_EDGE`), so the bin of `a` is
# `below + (a >= inside)`. An edge at a cell's first pattern is in `below`.
# The magnitude histogram's edges are more than an octave apart, so each has
# a cell to itself; a precision boundary whose cell already holds an edge is
# no edge, and the kernel counts it by an exact pass (`refined_edges`).
CELL_SHIFT = 17
CELLS = 1 << (31 - CELL_SHIFT)
_CELL_INSIDE = (1 << CELL_SHIFT) - 1
_NO_EDGE = 0x7FFFFFFF


@numba.njit(nogil=True, cache=True)
def fill_cells(edges, last, cells):
    """Fills `cells[: last + 1]` for the ascending `edges`, at most one inside each cell."""
    c = 0
    for j in range(edges.size + 1):
        stop = last + 1 if j == edges.size else min(edges[j] >> CELL_SHIFT, last + 1)
        cells[c:stop] = (np.int64(j) << 32) | _NO_EDGE
        c = stop
        if c > last:
            return
        if edges[j] & _CELL_INSIDE:
            cells[c] = (np.int64(j) << 32) | edges[j]
            c += 1


def _log_cells():
    """The cells of the magnitude histogram's edges alone, for every finite float32."""
    cells = np.empty(CELLS, np.int64)
    fill_cells(LOG_KEYS, (0x7F800000 >> CELL_SHIFT) - 1, cells)
    return cells


LOG_CELLS = _log_cells()


@numba.njit(nogil=True, cache=True)
def refined_edges(keys, above_all, log_keys):
    """The ascending edges of the refined bins: `log_keys` (`LOG_KEYS`) and each of the precision
    record's `keys` (`precision_counts.float32_keys`) that lies in `(1, above_all)` and in a cell
    with no other edge inside. Returns `(edges, placed)`: `placed[i]` says whether `keys[i]` is
    one (a key at or above `above_all` counts every value, a key of 1 the zeros).
    """
    placed = np.zeros(keys.size, np.bool_)
    edges = list(log_keys)
    for i in range(keys.size):
        k = keys[i]
        if k >= above_all or k <= 1:  # every value, or the zeros: no bin needed
            continue
        free = True
        for e in edges:
            inside = (e & _CELL_INSIDE) != 0 and (k & _CELL_INSIDE) != 0
            if e != k and inside and e >> CELL_SHIFT == k >> CELL_SHIFT:
                free = False
        if free and k not in edges:
            edges.append(k)
        placed[i] = free
    return np.sort(np.array(edges)), placed
