"""The host kernels' thread pool: one tensor per task, the largest first.

numba's kernels release the GIL, so the tensors of one log event are summarised on threads of
the calling process, each kernel on its thread alone (no nested parallelism).
"""

import concurrent.futures
import os

import numpy as np


def usable_cpus():
    """CPUs this process may run on (a container's share, not the host's count)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def in_threads(function, items, workers=None):
    """`[function(*item) for item in items]` on up to `workers` threads, largest arrays first
    (by each item's first entry)."""
    items = list(items)
    workers = workers or min(len(items), usable_cpus())
    if workers <= 1:
        return [function(*item) for item in items]
    order = sorted(range(len(items)), key=lambda i: -np.size(items[i][0]))
    results = [None] * len(items)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = {pool.submit(function, *items[i]): i for i in order}
        for future, i in futures.items():
            results[i] = future.result()
    return results
