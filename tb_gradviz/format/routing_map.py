"""The routing map of a pooling layer: for one probe example and a few channels, where each
window's maximum was and where its gradient went (docs/FORMAT.md, `routing_map`).

Numpy only: each backend's pass hands over the example's slice of the pool's
input, input gradient and output gradient, and this module picks the
channels, crops the map to the byte budget and finds each window's winner
with the documented rule (the first maximum in raster order, as TensorFlow's
CPU kernel and XLA on CPU route a tie). The input gradient in the record is
the backend's own, so a backend whose rule differs shows it there.
"""

import numpy as np

# At most this many float32 values per layer and event (64 KiB).
MAX_VALUES = 16384
MAX_CHANNELS = 8
DEFAULT_CHANNELS = 4


class Settings:
    """What the callback was asked to map.

    Args:
      example: the probe example (an index into the batch).
      channels: None for the `DEFAULT_CHANNELS` channels that receive the
        most gradient mass, an int k (1..8) for the k that receive the most,
        or a list of at most 8 channel indices.
      origin: None to centre the crop on the map, or `(row, col)` of the
        input position the crop starts at (clipped to the map).

    Raises:
      TypeError: an argument is not of a type allowed.
      ValueError: its value is not one allowed.
    """

    def __init__(self, example=0, channels=None, origin=None):
        message = (
            f"routing_map_example must be an int >= 0. Received: routing_map_example={example!r}"
        )
        if not _is_int(example):
            raise TypeError(message)
        if example < 0:
            raise ValueError(message)
        self.example = int(example)
        self.channels = None if channels is None else _checked_channels(channels)
        self.origin = None if origin is None else _checked_origin(origin)

    @property
    def channel_count(self):
        if self.channels is None:
            return DEFAULT_CHANNELS
        return self.channels if isinstance(self.channels, int) else len(self.channels)


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _checked_channels(channels):
    allowed = f"routing_map_channels must be None, a count 1..{MAX_CHANNELS} or a list of at most "
    allowed += f"{MAX_CHANNELS} distinct channel indices >= 0. Received: routing_map_channels="
    if _is_int(channels):
        if not 1 <= channels <= MAX_CHANNELS:
            raise ValueError(f"{allowed}{channels!r}")
        return int(channels)
    if not isinstance(channels, (list, tuple)) or not all(_is_int(c) for c in channels):
        raise TypeError(f"{allowed}{channels!r}")
    if (
        not channels
        or len(channels) > MAX_CHANNELS
        or len(set(channels)) != len(channels)
        or min(channels) < 0
    ):
        raise ValueError(f"{allowed}{channels!r}")
    return [int(c) for c in channels]


def _checked_origin(origin):
    allowed = "routing_map_origin must be None or (row, col), two ints >= 0. Received: "
    if not isinstance(origin, (list, tuple)) or not all(_is_int(v) for v in origin):
        raise TypeError(f"{allowed}routing_map_origin={origin!r}")
    if len(origin) != 2 or min(origin) < 0:
        raise ValueError(f"{allowed}routing_map_origin={origin!r}")
    return tuple(int(v) for v in origin)


def maps_layer(pooling, input_shape):
    """Whether a pooling layer gets a routing map: 1D, 2D and 3D pools."""
    return pooling is not None and len(input_shape) in (3, 4, 5)


def _as_volume(array, pooling):
    """An example's `[..., C]` or `[C, ...]` slice as `[C, D, H, W]` (2D: D = 1; 1D: D = H = 1)."""
    array = np.asarray(array)
    if pooling["data_format"] == "channels_first":
        array = np.moveaxis(array, 0, -1)
    while array.ndim < 4:
        array = array[None]
    return np.moveaxis(array, -1, 0)


def same_padding(n, k, s):
    """SAME pooling along an axis: `(windows, pad before, pad after)`.

    For `n` positions, windows of `k` and stride `s`.

    As Keras' backends pad: the odd position, if any, goes after.
    """
    count = -(-n // s)
    total = max((count - 1) * s + k - n, 0)
    return count, total // 2, total - total // 2


def window_axes(pooling, depth, height, width):
    """How a pool cuts windows along depth, rows and columns of a `depth x height x width` input.

    Returns:
      Per axis a dict: `kernel` and `stride` (input positions), `before` (the
      padding before the first position) and `count` (windows). A 2D pool has
      `kernel` 1 along depth, a 1D pool along depth and rows; a global pool is
      one window over each axis.
    """
    sizes = (depth, height, width)
    if pooling["global"]:
        return [{"kernel": n, "stride": n, "before": 0, "count": 1} for n in sizes]
    kernels, strides = list(pooling["pool_size"]), list(pooling["strides"])
    kernels, strides = [1] * (3 - len(kernels)) + kernels, [1] * (3 - len(strides)) + strides
    axes = []
    for n, k, s in zip(sizes, kernels, strides):
        if pooling["padding"] == "same":
            count, before, _ = same_padding(n, k, s)
        else:
            count, before = (n - k) // s + 1, 0
        axes.append(
            {"kernel": int(k), "stride": int(s), "before": int(before), "count": int(count)}
        )
    return axes


def _geometry(pooling, depth, height, width):
    """Per axis `(first input position of each window, its size)`: depth, rows, columns."""
    return [
        (np.arange(axis["count"]) * axis["stride"] - axis["before"], axis["kernel"])
        for axis in window_axes(pooling, depth, height, width)
    ]


def _crop(starts, size, n, budget_windows, origin):
    """The windows `[first, last)` along one axis that fit, and the input span they cover."""
    count = len(starts)
    keep = max(1, min(count, budget_windows))
    if origin is None:
        first = (count - keep) // 2
    else:
        first = int(np.clip(np.searchsorted(starts, origin, side="left"), 0, count - keep))
    if keep == count:  # every window: the whole map, with positions no window covers
        return 0, count, 0, n
    low = max(int(starts[first]), 0)
    high = min(int(starts[first + keep - 1]) + size, n)
    return first, first + keep, low, high


def _clip_start(origin, n, side):
    start = (n - side) // 2 if origin is None else origin
    return int(np.clip(start, 0, max(n - side, 0)))


def layout(pooling, input_shape, settings):
    """Where the map is cut: the same for every event of a run (it depends on shapes only).

    Args:
      pooling: the layer's pooling description.
      input_shape: the pool input's shape, batch first.
      settings: the callback's `Settings`.

    Returns:
      A dict for the metadata: `map` (the input's height and width),
      `crop` (`row`, `col`, `height`, `width` of the recorded input region),
      `windows` (`row`, `col`, `rows`, `cols`: the window index range)
      and `values` per channel row.
    """
    if pooling["data_format"] == "channels_first":
        spatial = list(input_shape[2:])
    else:
        spatial = list(input_shape[1:-1])
    depth, height, width = ([1, 1] + spatial)[-3:]
    (depth_starts, kd), (row_starts, kh), (col_starts, kw) = _geometry(
        pooling, depth, height, width
    )
    # 3D pools: the windows of the middle output depth, shown on the middle
    # input plane of their depth range.
    depth_window = len(depth_starts) // 2
    plane = int(np.clip(depth_starts[depth_window] + kd // 2, 0, depth - 1))
    channels = settings.channel_count
    budget = MAX_VALUES // channels - 1
    rows, cols = len(row_starts), len(col_starts)
    origin = settings.origin or (None, None)
    # Shrink the window ranges, the longer side first, until the channel row fits.
    while True:
        r0, r1, top, bottom = _crop(row_starts, kh, height, rows, origin[0])
        c0, c1, left, right = _crop(col_starts, kw, width, cols, origin[1])
        values = 2 * (bottom - top) * (right - left) + 3 * (r1 - r0) * (c1 - c0)
        if values <= budget or (rows == 1 and cols == 1):
            break
        if rows >= cols and rows > 1:
            rows -= 1
        else:
            cols -= 1
    if values > budget:
        # One window larger than the budget (a global pool of a large map):
        # a square of it, centred or at the origin; its winner may lie outside.
        side = int(np.sqrt((budget - 3) / 2))
        top = _clip_start(origin[0], height, side)
        left = _clip_start(origin[1], width, side)
        bottom, right = min(top + side, height), min(left + side, width)
        values = 2 * (bottom - top) * (right - left) + 3
    sliced = (
        {"depth": {"size": depth, "window": depth_window, "plane": plane}}
        if len(spatial) == 3
        else {}
    )
    return {
        **sliced,
        "map": {"height": height, "width": width},
        "crop": {"row": top, "col": left, "height": bottom - top, "width": right - left},
        "windows": {"row": r0, "col": c0, "rows": r1 - r0, "cols": c1 - c0},
        "values": 1 + values,
    }


def chosen_channels(input_gradient_planes, settings):
    """The channels mapped: those given (beyond the layer's channels left out), or those whose input
    gradient has the largest mass: the most infinite values first, then the largest sum of the
    finite |g|, then the lower index. NaN counts as no mass."""
    if isinstance(settings.channels, list):
        count = input_gradient_planes.shape[0]
        return [c for c in settings.channels if c < count]
    planes = np.asarray(input_gradient_planes, dtype=np.float64)
    planes = planes.reshape(len(planes), -1)
    infinite = np.isinf(planes).sum(axis=1)
    with np.errstate(over="ignore"):  # float64 sums of huge float64 values rank as inf
        mass = np.abs(np.where(np.isfinite(planes), planes, 0.0)).sum(axis=1)
    order = np.lexsort((np.arange(len(mass)), -mass, -infinite))
    return sorted(order[: settings.channel_count].tolist())


def record(pooling, inputs, input_gradient, output_gradient, cut, settings):
    """Returns the `[channels, values]` float32 routing map of one example.

    Args:
      pooling: the layer's pooling description.
      inputs, input_gradient, output_gradient: the example's slices (no
        batch axis), in the layer's data format.
      cut: `layout(...)`.
      settings: the callback's `Settings`.

    Each row: the channel index; the cropped input map and input gradient
    (row-major); per window of the crop (row-major): the flat index of its
    winner in the crop (-1 for an average pool, or a winner outside the
    crop), 1 if its maximum is tied, else 0 (NaN for average pools), and the
    upstream gradient it received.
    """
    x = _as_volume(inputs, pooling).astype(np.float32)
    gi = _as_volume(input_gradient, pooling).astype(np.float32)
    go = _as_volume(output_gradient, pooling).astype(np.float32)
    go = go.reshape(go.shape[0], -1)  # one value per window, raster order (global pools: one)
    depth, height, width = x.shape[1:]
    (depth_starts, kd), (row_starts, kh), (col_starts, kw) = _geometry(
        pooling, depth, height, width
    )
    depth_window = cut.get("depth", {}).get("window", 0)
    plane = cut.get("depth", {}).get("plane", 0)
    crop, windows = cut["crop"], cut["windows"]
    top, left, h, w = crop["row"], crop["col"], crop["height"], crop["width"]
    columns, window_offset = len(col_starts), depth_window * len(row_starts) * len(col_starts)
    window_rows = range(windows["row"], windows["row"] + windows["rows"])
    window_cols = range(windows["col"], windows["col"] + windows["cols"])
    channels = chosen_channels(gi, settings)
    count = len(window_rows) * len(window_cols)
    if not channels:
        return np.zeros((0, 1 + 2 * h * w + 3 * count), np.float32)
    # Every window of the crop at once: its values [channels, rows, cols, kd * kh * kw],
    # positions outside the input at -inf (they never hold a maximum).
    z = int(depth_starts[depth_window]) + np.arange(kd)
    r = np.asarray([[int(row_starts[i]) + d for d in range(kh)] for i in window_rows])
    q = np.asarray([[int(col_starts[j]) + d for d in range(kw)] for j in window_cols])
    index_z = np.clip(z, 0, depth - 1)[None, None, :, None, None]
    index_r = np.clip(r, 0, height - 1)[:, None, None, :, None]
    index_q = np.clip(q, 0, width - 1)[None, :, None, None, :]
    inside = (
        ((z >= 0) & (z < depth))[None, None, :, None, None]
        & ((r >= 0) & (r < height))[:, None, None, :, None]
        & ((q >= 0) & (q < width))[None, :, None, None, :]
    )
    values = x[channels][:, index_z, index_r, index_q]
    values = np.where(inside, values, -np.inf).reshape(len(channels), count, kd * kh * kw)
    upstream = go[channels][
        :, [window_offset + i * columns + j for i in window_rows for j in window_cols]
    ]
    if pooling["type"] == "max":
        flat = np.argmax(
            values, axis=-1
        )  # the first maximum in raster order (a NaN wins, as argmax)
        peak = np.take_along_axis(values, flat[..., None], axis=-1)
        tied = ((values == peak).sum(axis=-1) > 1).astype(np.float32)
        in_plane, flat = flat // (kh * kw), flat % (kh * kw)
        rows_at = np.repeat(r, len(window_cols), axis=0)[np.arange(count), flat // kw]
        cols_at = np.tile(q, (len(window_rows), 1))[np.arange(count), flat % kw]
        in_crop = (
            (z[in_plane] == plane)
            & (rows_at >= top)
            & (rows_at < top + h)
            & (cols_at >= left)
            & (cols_at < left + w)
        )
        winners = np.where(in_crop, (rows_at - top) * w + (cols_at - left), -1)
    else:
        winners = np.full((len(channels), count), -1)
        tied = np.full((len(channels), count), np.nan)
    return np.concatenate(
        [
            np.asarray(channels, np.float32)[:, None],
            x[channels, plane, top : top + h, left : left + w].reshape(len(channels), -1),
            gi[channels, plane, top : top + h, left : left + w].reshape(len(channels), -1),
            winners,
            tied,
            upstream,
        ],
        axis=1,
    ).astype(np.float32)


def valid_rows(array, cut):
    """Which channel rows of a routing map record (`[channels, values]`) hold whole counts.

    A row is malformed, as a row of another record layout whose counts are
    not whole, non-negative numbers, when its channel is not a whole number
    >= 0, a winner not a whole number >= -1, or a tie mark not 0, 1 or NaN.
    """
    crop, windows = cut["crop"], cut["windows"]
    cells, count = crop["height"] * crop["width"], windows["rows"] * windows["cols"]
    array = np.asarray(array, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] != 1 + 2 * cells + 3 * count:
        return np.zeros(len(array), bool)
    channel = array[:, 0]
    winner = array[:, 1 + 2 * cells : 1 + 2 * cells + count]
    tied = array[:, 1 + 2 * cells + count : 1 + 2 * cells + 2 * count]
    with np.errstate(invalid="ignore"):
        whole_channel = np.isfinite(channel) & (channel >= 0) & (channel == np.floor(channel))
        whole_winner = np.isfinite(winner) & (winner >= -1) & (winner == np.floor(winner))
        marked = np.isnan(tied) | (tied == 0) | (tied == 1)
    return whole_channel & whole_winner.all(axis=1) & marked.all(axis=1)


def decode(row, cut):
    """One channel row of a routing map as a dict of lists (for the API and `export`).

    The row must be one that `valid_rows` accepts.
    """
    crop, windows = cut["crop"], cut["windows"]
    cells, count = crop["height"] * crop["width"], windows["rows"] * windows["cols"]
    row = np.asarray(row, dtype=np.float64)
    parts = np.split(row[1:], np.cumsum([cells, cells, count, count]))
    return {
        "channel": int(row[0]),
        "input": parts[0].tolist(),
        "input_gradient": parts[1].tolist(),
        "winner": parts[2].astype(np.int64).tolist(),
        "tied": [None if np.isnan(v) else bool(v) for v in parts[3]],
        "output_gradient": parts[4].tolist(),
    }
