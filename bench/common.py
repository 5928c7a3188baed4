"""Shared helpers of the bench scripts: models, timing, tables, JSON, the browser.

Timings are wall clock on a shared machine, so every script measures the
things it compares inside one loop, interleaved (A, B, A, B, ...), and
reports medians and the median of the per-repeat ratios: a neighbour's load
then slows both sides of each ratio alike.
"""

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def parser(description):
    """An ArgumentParser with the flags every bench script takes."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, to check the script runs (not a measurement)",
    )
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--seed", type=int, default=0)
    return p


def seconds(fn):
    """Runs `fn()` once; returns its wall time in seconds."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def timed(fn, spent, part, cpu_part=None):
    """`fn`, adding the seconds each call takes to `spent[part]`, and, given `cpu_part`, the CPU
    time of its thread to `spent[cpu_part]` (the wall time of a call on a thread that shares the
    cores with others counts the time it waited for one)."""

    def call(*args, **kwargs):
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[part] += time.perf_counter() - start
            if cpu_part is not None:
                spent[cpu_part] += time.thread_time() - cpu

    return call


def median(values):
    return statistics.median(values)


def percentile(values, q):
    """The q-th percentile (0..100), linear interpolation, as numpy's default."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def machine():
    """What the numbers were measured on."""
    info = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }
    # name -> the distributions that may provide it, first found wins
    distributions = {
        "tensorflow": ("tensorflow-cpu", "tensorflow"),
        "keras": ("keras",),
        "tensorboard": ("tensorboard",),
        "numpy": ("numpy",),
        "numba": ("numba",),
        "google-crc32c": ("google-crc32c",),
        "jax": ("jax",),
        "jaxlib": ("jaxlib",),
        "torch": ("torch",),
    }
    for name, candidates in distributions.items():
        info[name] = None
        for distribution in candidates:
            try:
                info[name] = importlib.metadata.version(distribution)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    with open("/proc/loadavg") as f:
        info["loadavg_at_start"] = f.read().split()[:3]
    return info


def print_table(title, rows, columns):
    """Prints `rows` (dicts) as a fixed-width table of `columns` (key, header, format)."""
    print(f"\n{title}")
    cells = [[header for _, header, _ in columns]]
    for row in rows:
        cells.append(
            [("-" if row.get(key) is None else fmt.format(row[key])) for key, _, fmt in columns]
        )
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for n, line in enumerate(cells):
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths)))
        if n == 0:
            print("  ".join("-" * width for width in widths))


def write_json(path, payload):
    if path:
        with open(path, "w") as f:
            json.dump(
                dict(payload, machine=machine(), date=time.strftime("%Y-%m-%d %H:%M:%S %Z")),
                f,
                indent=1,
            )
        print(f"\nwrote {path}")


def report(script, args, rows, digits=3):
    """Prints each row as a `RESULT` line (floats rounded to `digits`), then writes the rows to
    `args.json` (`write_json`) under the script's name and its arguments."""
    for row in rows:
        print(
            "RESULT", {k: round(v, digits) if isinstance(v, float) else v for k, v in row.items()}
        )
    write_json(args.json, {"script": script, "args": vars(args), "rows": rows})


# ---------------------------------------------------------------- models


def small_cnn(image_size=32, classes=10):
    """A small Functional CNN (two conv + max-pool stages, a global pool, a dense head)."""
    import keras

    layers = keras.layers
    inputs = keras.Input((image_size, image_size, 3))
    h = layers.Conv2D(32, 3, padding="same", activation="relu", name="conv1")(inputs)
    h = layers.MaxPooling2D(2, name="pool1")(h)
    h = layers.Conv2D(64, 3, padding="same", activation="relu", name="conv2")(h)
    h = layers.MaxPooling2D(2, name="pool2")(h)
    h = layers.Conv2D(64, 3, padding="same", activation="relu", name="conv3")(h)
    h = layers.GlobalAveragePooling2D(name="gap")(h)
    outputs = layers.Dense(classes, name="head")(h)
    return keras.Model(inputs, outputs, name="small_cnn")


def build_model(name, image_size, seed):
    """Returns a compiled model: `"cnn"` (small CNN) or `"resnet50"` (weights=None)."""
    import keras

    keras.utils.set_random_seed(seed)
    if name == "cnn":
        model = small_cnn(image_size)
    elif name == "resnet50":
        model = keras.applications.ResNet50(
            weights=None, input_shape=(image_size, image_size, 3), classes=10
        )
    else:
        raise ValueError(f"model must be 'cnn' or 'resnet50'; received {name!r}")
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=name == "cnn"))
    return model


def batch(size, image_size, seed, classes=10):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (size, image_size, image_size, 3)).astype("float32")
    y = rng.integers(0, classes, size).astype("int32")
    return x, y


def rss_kb(pid):
    """Resident set size of a process in kB (Linux /proc), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def children(pid):
    """Direct and indirect child pids of a process (Linux /proc)."""
    result, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as f:
                kids = [int(p) for p in f.read().split()]
        except OSError:
            kids = []
        result += kids
        frontier += kids
    return result


CHILD_OPTIONS = ("model", "image_size", "batch", "layers", "repeats", "seed")


def child_command(script, args, options=CHILD_OPTIONS):
    """The command that runs `script` again as a child (`--child`) with `args`' `options`."""
    command = [sys.executable, os.path.abspath(script), "--child"]
    for name in options:
        command += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    return command


# The browser tests' helpers (tests/browser.py): Chromium's path and offline flags, the tab's
# frame, and `wait_drawn`, the wait until a view says it has drawn the state asked for.
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import browser  # noqa: E402, F401
from browser import CHROMIUM, CHROMIUM_ARGS, PLUGIN_FRAME, wait_drawn  # noqa: E402, F401


@contextlib.contextmanager
def chromium_page(width, height, timeout_s):
    """A page of headless Chromium (`width` x `height`, `timeout_s` for each wait) and the list
    its uncaught page errors are appended to; the browser is closed on leaving."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(timeout_s * 1000)
            errors = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            yield page, errors
        finally:
            browser.close()
