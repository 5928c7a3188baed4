"""How the device statistics lay tensors out: packed into chunks of one shape, and back.

A compiled program is specialised on the shapes of its inputs, and XLA takes
seconds to compile the statistics. So the device statistics never run on a
tensor's own shape: the tensors of one dtype are packed, in order, into chunks
of `[rows, ROW_VALUES]` values, zero-padded, and every chunk of a size runs one
program. Where each tensor lies is data (`Chunk.data`, per row): its slot in
the chunk, where the row begins in the tensor, the tensor's laid-out length and
its lines. Chunks have `chunk_rows` rows and `SLOTS` slots; a dtype's only
chunk, when it is not full, is cut to powers of two (few distinct sizes, little
padding). Full chunks grow to hold the event's longest tensor, up to `GROWTH`
times, so that one program runs them all; a tensor longer still has a chunk of
its own.

With the block record, a tensor whose last axis is not a whole number of
blocks (32 values) has each line padded with zeros to whole blocks, so that no
block straddles two lines; each row, `ROW_VALUES` values, is whole blocks too.
The statistics leave every padded value out (`valid`); the block record counts
nothing of a zero.

Imports keras and numpy only.
"""

import dataclasses

import keras
import numpy as np

ops = keras.ops

# Values per row of a chunk: a multiple of every block size.
ROW_VALUES = 1 << 12
# The most tensors one chunk holds.
SLOTS = 64
# How many times its rows a full chunk grows to hold the event's longest tensor (one program
# less to compile, at most a chunk this size held at a time).
GROWTH = 4
_BLOCK = 32


def chunk_rows(chunk_values):
    """The rows of a full chunk of `chunk_values` values (a power of two, at least 1)."""
    return _power_of_two(max(1, chunk_values // ROW_VALUES))


@dataclasses.dataclass
class Chunk:
    """Tensors packed into one `[rows, ROW_VALUES]` buffer of `dtype`.

    Attributes:
      dtype: the tensors' dtype (the buffer's).
      tensors: indices of the tensors, in slot order.
      rows: the buffer's rows.
      slots: the results' slots (at least `len(tensors)`).
      spans: per tensor, `(rows, laid-out length, line length, width)`: lines of
        `width` values padded to `line` (1 and 1: not padded).
      data: per row, int32 numpy arrays: `slot` (-1: a padding row), `first`
        (the row's first position in its tensor's layout), `length` (the
        tensor's laid-out length), `line` and `width` (values beyond `width`
        in each line of `line` values are padding), and `scaled` (1 where the
        divisor divides the tensor).
    """

    dtype: str
    tensors: list
    rows: int
    slots: int
    spans: list
    data: dict

    @property
    def key(self):
        """What the chunk's program depends on."""
        return (self.dtype, self.rows, self.slots)


def layout(sizes, dtypes, scaled, widths, chunk_values):
    """Packs tensors into `Chunk`s, in the order given, each dtype's into its own chunks.

    Args:
      sizes: per tensor, its number of values.
      dtypes: per tensor, its dtype (a string).
      scaled: per tensor, whether the divisor divides it.
      widths: None, or per tensor the length of its last axis (None: unknown):
        then lines are padded to whole blocks.
      chunk_values: the values of a full chunk, before it grows (`GROWTH`).
    """
    spans = [_span(n, None if widths is None else widths[i]) for i, n in enumerate(sizes)]
    full_rows = chunk_rows(chunk_values)
    longest = _power_of_two(max((span[0] for span in spans), default=1))
    full_rows = max(full_rows, min(longest, GROWTH * full_rows))
    chunks, open_chunks = [], {}

    def close(dtype, last):
        chunk = open_chunks.pop(dtype)
        used = sum(span[0] for span in chunk.spans)
        rows = _power_of_two(max(used, 1))
        # A dtype's last chunk keeps the full shape when a full chunk already runs its program
        # (one program less to compile, a chunk of padding more to read); alone, it is cut.
        alone = all(c.key != chunk.key for c in chunks)
        if (last and rows < full_rows and alone) or used > full_rows:
            chunk.rows, chunk.slots = rows, _power_of_two(len(chunk.tensors))
        chunk.data = _row_data(chunk, [scaled[i] for i in chunk.tensors])
        chunks.append(chunk)

    for i, (span, dtype) in enumerate(zip(spans, dtypes)):
        chunk = open_chunks.get(dtype)
        if chunk is not None and (
            len(chunk.tensors) == SLOTS or sum(s[0] for s in chunk.spans) + span[0] > full_rows
        ):
            close(dtype, last=False)
            chunk = None
        if chunk is None:
            chunk = open_chunks[dtype] = Chunk(dtype, [], full_rows, SLOTS, [], {})
        chunk.tensors.append(i)
        chunk.spans.append(span)
    for dtype in list(open_chunks):
        close(dtype, last=True)
    return chunks


def _span(n, width):
    if width and width % _BLOCK:
        line = -(-width // _BLOCK) * _BLOCK
        length = n // width * line
    else:
        line = width = 1
        length = n
    return (-(-length // ROW_VALUES), length, line, width)


def _row_data(chunk, scaled):
    data = {name: np.zeros(chunk.rows, np.int32) for name in ("first", "length", "line", "width")}
    data["slot"] = np.full(chunk.rows, -1, np.int32)
    data["scaled"] = np.zeros(chunk.rows, np.int32)
    row = 0
    for slot, ((rows, length, line, width), divided) in enumerate(zip(chunk.spans, scaled)):
        part = slice(row, row + rows)
        data["slot"][part] = slot
        data["first"][part] = np.arange(rows) * ROW_VALUES
        data["length"][part], data["line"][part], data["width"][part] = length, line, width
        data["scaled"][part] = int(divided)
        row += rows
    return data


def _power_of_two(n):
    return 1 << (int(n) - 1).bit_length()


def pack(chunk, tensors, after=None):
    """The chunk's `[rows, ROW_VALUES]` buffer of `tensors` (those of `chunk.tensors`, in order).

    `after`, a scalar count of the previous chunk's results (never negative),
    makes the buffer depend on them: a compiler or an executor that could copy
    every chunk first then packs each after the previous one is summarised,
    so that one chunk's copy is held at a time.
    """
    parts = []
    for t, (rows, length, line, width) in zip(tensors, chunk.spans):
        flat = ops.reshape(t, [-1])
        if after is not None:  # an elementwise select, fused into the copy
            flat = ops.where(ops.less(after, 0), ops.zeros_like(flat), flat)
        if line != width:
            flat = ops.reshape(
                ops.pad(ops.reshape(flat, [-1, width]), [[0, 0], [0, line - width]]), [-1]
            )
        if rows:
            parts.append(ops.pad(flat, [[0, rows * ROW_VALUES - length]]))
    used = sum(span[0] for span in chunk.spans)
    if used < chunk.rows:
        parts.append(ops.zeros([(chunk.rows - used) * ROW_VALUES], chunk.dtype))
    flat = parts[0] if len(parts) == 1 else ops.concatenate(parts)
    return ops.reshape(flat, [chunk.rows, ROW_VALUES])


def run(groups, scaled, tensors, divisor, widths, chunk_values, pack, statistics):
    """Each group's statistics (`unpack`) of `tensors` laid out in chunks of `chunk_values` values
    (`layout`), each packed by `pack(chunk, tensors, after)` and summarised per slot by
    `statistics(chunk, buffer, data, divisor)`."""
    order = [i for indices in groups for i in indices]
    sizes = [_size(tensors[i]) for i in order]
    dtypes = [keras.backend.standardize_dtype(tensors[i].dtype) for i in order]
    chunked = layout(
        sizes,
        dtypes,
        [scaled[i] for i in order],
        None if widths is None else [widths[i] for i in order],
        chunk_values,
    )
    results = []
    for chunk in chunked:
        chunk.tensors = [order[i] for i in chunk.tensors]
        # The second read's count: the previous chunk's buffer is read by then.
        after = results[-1]["linear"][0, 0] if results else ops.zeros((), "int32")
        buffer = pack(chunk, [tensors[i] for i in chunk.tensors], after)
        data = {k: ops.convert_to_tensor(v) for k, v in chunk.data.items()}
        results.append(statistics(chunk, buffer, data, divisor))
    return unpack(chunked, results, groups, widths, _concrete(results))


def _size(tensor):
    size = int(np.prod(tensor.shape)) if None not in tuple(tensor.shape) else None
    if size is None:
        raise ValueError(
            "The device statistics need tensors of known shapes. "
            f"Received: a tensor of shape {tuple(tensor.shape)}"
        )
    return size


def _concrete(results):
    """Whether `results` hold values (eager), not a graph's symbolic tensors."""
    some = next(iter(results[0].values())) if results else None
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.executing_eagerly()
    if keras.backend.backend() == "jax":
        import jax

        return not isinstance(some, jax.core.Tracer)
    return True


# How a slot's rows combine: by their minimum, maximum, else sum.
_REDUCE = {"low": ops.min, "high": ops.max, "amax_bits": ops.max, "block_amax": ops.max}


def identity(name):
    """The value a slot's combination of `name` starts from (`_REDUCE`)."""
    return {"low": np.inf, "high": -np.inf}.get(name, 0)


def to_slots(per_row, one_hot):
    """`{name: [slots, ...]}` of `{name: [r, ...]}`: each slot's rows combined (`_REDUCE`).

    `one_hot` (`[r, slots]`) says which slot each row belongs to (none for
    padding rows): a comparison and a reduction, no scatter.
    """
    result = {}
    for name, x in per_row.items():
        mask = ops.reshape(one_hot, tuple(one_hot.shape) + (1,) * (len(x.shape) - 1))
        start = ops.cast(identity(name), x.dtype)
        combined = _REDUCE.get(name, ops.sum)(ops.where(mask, x[:, None], start), axis=0)
        result[name] = ops.cast(combined, x.dtype)
    return result


def from_slots(per_slot, one_hot):
    """`[r, ...]`: each row's value of its slot in `per_slot` (`[slots, ...]`; 0 for no slot)."""
    mask = ops.reshape(one_hot, tuple(one_hot.shape) + (1,) * (len(per_slot.shape) - 1))
    zero = ops.zeros_like(per_slot[None])
    return ops.sum(ops.where(mask, per_slot[None], zero), axis=1)


def unpack(chunks, results, groups, widths, concrete):
    """Each group's results (`{name: [R, ...]}`, a tensor's row per index) from the chunks'.

    Args:
      chunks: `layout`'s chunks.
      results: per chunk, `{name: [slots, ...]}`.
      groups: lists of tensor indices.
      widths: None, or per tensor its block width (None: no block record).
      concrete: whether `results` hold values (then numpy does the work) or
        are symbolic (then `keras.ops`, in the caller's graph).
    """
    where = {}
    for c, chunk in enumerate(chunks):
        for slot, i in enumerate(chunk.tensors):
            where[i] = (c, slot)
    if concrete:
        results = [{k: np.asarray(ops.convert_to_numpy(v)) for k, v in r.items()} for r in results]
        concatenate = np.concatenate
    else:
        concatenate = ops.concatenate
    grouped = []
    for indices in groups:
        runs = []  # (chunk, first slot, last slot + 1), consecutive slots of one chunk
        for i in indices:
            c, slot = where[i]
            if runs and runs[-1][0] == c and runs[-1][2] == slot:
                runs[-1][2] += 1
            else:
                runs.append([c, slot, slot + 1])
        width = None if widths is None else widths[indices[0]]
        group = {}
        for name in results[0]:
            if name.startswith("block/") and width is None:
                continue
            parts = [results[c][name][begin:end] for c, begin, end in runs]
            group[name] = parts[0] if len(parts) == 1 else concatenate(parts, axis=0)
        if width is not None:
            some = group["block/nvfp4/to_zero"]
            group["block_width"] = (
                np.full(len(indices), width, np.int32)
                if concrete
                else ops.zeros_like(some, "int32") + width
            )
        grouped.append(group)
    return grouped
