"""The plugin's caches are bounded in entries and in bytes, and the lock of a read lives only while
the read is in flight: neither grows with what a long-running TensorBoard has served."""

import eventdata
import synthetic
from tensorboard import context

from tb_gradviz.board import routes, series
from tb_gradviz.format import records

ENTRY = series.ENTRY_BYTES


class LockCountingProvider(eventdata.ReadingProvider):
    """Records each `read_tensors` as `(tags, reading locks alive while it reads)`."""

    locks = None

    def on_read(self, plugin_name, tags):
        self.reads.append((tags, len(self.locks)))


def gradviz_over(logdir, provider_class=eventdata.ReadingProvider):
    return eventdata.plugin_over(logdir, provider_class)[0]


def test_a_cache_keeps_at_most_its_entries_and_bytes_least_recently_used_dropped_first():
    cache = series.VersionedCache(max_entries=3, max_bytes=3 * ENTRY + 250, size=len)
    cache.put("a", 1, "x" * 100)
    cache.put("b", 1, "x" * 100)
    assert cache.keys_by_use() == ["a", "b"] and cache.nbytes == 2 * (ENTRY + 100)
    cache.put("c", 1, "x" * 100)  # 300 bytes of values: "a" goes
    assert cache.keys_by_use() == ["b", "c"] and cache.nbytes == 2 * (ENTRY + 100)
    assert cache.get("b", 1) == "x" * 100 and cache.get("b", 2) is None
    cache.put("d", 1, "x" * 10)
    assert cache.keys_by_use() == ["c", "b", "d"] and cache.nbytes == 3 * ENTRY + 210
    cache.put("e", 1, "x" * 10)  # a fourth entry: the least recently used goes
    assert cache.keys_by_use() == ["b", "d", "e"] and cache.nbytes == 3 * ENTRY + 120
    cache.put("b", 2, "x" * 20)  # a new version replaces the old, bytes and all
    assert cache.keys_by_use() == ["d", "e", "b"] and cache.nbytes == 3 * ENTRY + 40
    cache.put(
        "huge", 1, "x" * (2 * ENTRY + 251)
    )  # larger than the cache alone: not kept, nothing dropped
    assert cache.keys_by_use() == ["d", "e", "b"] and cache.get("huge", 1) is None


def test_the_gzipped_bodies_are_bounded_in_bytes():
    bodies = [{"values": [float(i)] * 1000} for i in range(3)]
    # 64 bytes the dict, its key's 6, 64 the list and 32 each number.
    assert series.body_bytes(bodies[0]) == 64 + 6 + 64 + 32 * 1000
    sizes = []
    for body in bodies:
        probe = routes.Encodings()
        sizes.append(len(probe.gzipped(body)) + series.body_bytes(body) + ENTRY)
    encodings = routes.Encodings(size=8, max_bytes=sizes[1] + sizes[2])
    first = encodings.gzipped(bodies[0])
    assert encodings.gzipped(bodies[0]) is first and len(encodings) == 1
    encodings.gzipped(bodies[1])
    encodings.gzipped(bodies[2])  # the first goes: two bodies fill the bytes
    assert len(encodings) == 2
    assert encodings.gzipped(bodies[0]) is not first and len(encodings) == 2


def test_the_series_cache_is_bounded_in_bytes(tmp_path):
    synthetic.write_run(tmp_path / "run", layers=3, steps=40)
    ctx = context.RequestContext()
    tensors = [(f"block{i}/pool", "activation") for i in range(3)]

    def cached_tags(gradviz):
        return {key[3] for key in gradviz._caches.series.keys_by_use()}

    gradviz, added = gradviz_over(tmp_path), []
    for layer, tensor in tensors:
        before = gradviz._caches.series.nbytes
        gradviz.series_impl(ctx, "", "run", layer, tensor, width=None)
        added.append(gradviz._caches.series.nbytes - before)
    # Each tensor's stats and histograms, every step, with what each entry costs besides.
    tags = [{records.stats_tag(*t), records.histogram_tag(*t)} for t in tensors]
    assert cached_tags(gradviz) == set().union(*tags)
    assert added[0] > 2 * ENTRY + 40 * 8 and added == [added[0]] * 3
    # Room for one tensor's two series and not one byte more: the others go.
    bounded = gradviz_over(tmp_path)
    bounded._caches = series.Caches(max_series_bytes=added[0])
    for layer, tensor in tensors:
        body = bounded.series_impl(ctx, "", "run", layer, tensor, width=None)
        assert len(body["steps"]) == 40 and body["histogram"]["counts"][-1] is not None
    assert cached_tags(bounded) == tags[-1]
    assert bounded._caches.series.nbytes == added[0]


def test_a_reading_lock_lives_only_while_its_read_is_in_flight(tmp_path):
    runs = [f"run{i}" for i in range(5)]
    for seed, run in enumerate(runs):
        synthetic.write_run(tmp_path / run, layers=4, steps=3, seed=seed)
    ctx = context.RequestContext()
    gradviz = gradviz_over(tmp_path, LockCountingProvider)
    provider = gradviz._data_provider
    provider.locks = gradviz._caches.locks
    for run in runs:
        gradviz.step_impl(ctx, "", run)
        for layer in [f"block{i}/pool" for i in range(4)]:
            for tensor in ("activation", "input_gradient", "output_gradient"):
                gradviz.series_impl(ctx, "", run, layer, tensor)
            gradviz.routing_impl(ctx, "", run, layer)
    # One request at a time: each read holds the locks of the series it reads, and no other.
    assert len(provider.reads) > len(runs) * 4 * 4
    assert [held for _, held in provider.reads] == [len(tags) for tags, _ in provider.reads]
    for run in runs:
        gradviz.timeline_impl(ctx, "", run)
        gradviz.onset_impl(ctx, "", run)
    # Whatever the caches hold, no lock outlives its read.
    assert len(gradviz._caches.series.keys_by_use()) > 100
    assert len(gradviz._caches.locks) == 0
