"""The order of test files, for `tests/run.sh`'s two pytest-xdist workers.

With `--dist loadfile` each file runs whole on one worker, and a worker takes
its next file when the one it runs is nearly done. xdist's default order (most
tests first) starts last the files of a few tests that take minutes (a whole
demo, a child process per backend, a bench's smoke run), and one worker then
runs such a file alone while the other has finished. Here those files go
first and the rest follow by number of tests, as xdist would order them;
tests/run.sh passes `--no-loadscope-reorder` so that xdist keeps this order.
Within a file the order is the file's own.
"""

import collections

# The longest files first (roughly in order of their time on 2 cores), then the
# cross-backend files whose fits and compiles make them the longest of a
# JAX or PyTorch run.
FIRST = (
    "test_bench_smoke.py",
    "test_demo.py",
    "test_demo_interrupt.py",
    "test_backend_runs.py",
    "test_packaging.py",
    "test_backends.py",
    "test_device_statistics.py",
    "test_in_step_backends.py",
    "test_judgement.py",
    "test_weights.py",
)


def pytest_collection_modifyitems(items):
    counts = collections.Counter(item.path.name for item in items)
    rank = {name: i for i, name in enumerate(FIRST)}
    # A stable sort: the tests of one file keep their order.
    items.sort(key=lambda item: (rank.get(item.path.name, len(FIRST)), -counts[item.path.name]))
