"""Requests that need the same series at the same time read it once.

The tab asks for a long run's /timeline at several widths at once while its
layout settles; each read of the run's digest series is hundreds of MB, and
TensorBoard with its data server held 4.5 GB when every request read it.
"""

import threading
import time

import eventdata
import numpy as np
from tensorboard import context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from test_timeline import STEPS, WHOLE, write

from tb_gradviz.board import plugin, timeline
from tb_gradviz.format import digest


class SlowProvider(eventdata.ReadingProvider):
    """Keeps each tag read, each read slowed down so that requests overlap."""

    def on_read(self, plugin_name, tags):
        self.reads += tags
        time.sleep(0.5)


def test_timelines_asked_at_once_at_several_widths_read_the_digest_once(tmp_path):
    write(tmp_path / "run")
    gradviz, provider = eventdata.plugin_over(tmp_path, SlowProvider)
    bodies = {}

    def timeline(width):
        bodies[width] = gradviz.timeline_impl(context.RequestContext(), "", "run", width=width)

    threads = [threading.Thread(target=timeline, args=(width,)) for width in (10, 20, 30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    digest_reads = [tag for tag in provider.reads if tag.startswith(digest.TAG_PREFIX + "/")]
    assert len(set(digest_reads)) == 1 and len(digest_reads) == 1, provider.reads
    for width, body in bodies.items():
        assert body["steps"] == STEPS and len(body["columns"]["first_step"]) == width
    # Each width's envelope is of the same values: the largest of all columns agree.
    assert len({np.nanmax(bodies[w]["layers"][0]["rms"]["max"]) for w in bodies}) == 1


def test_timeline_bodies_of_a_run_are_built_one_at_a_time_and_once_per_width(tmp_path, monkeypatch):
    write(tmp_path / "run")
    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance=WHOLE)
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(tmp_path))
    gradviz = plugin.GradVizPlugin(
        base_plugin.TBContext(logdir=str(tmp_path), data_provider=provider)
    )
    building, most, widths = [0], [0], []
    body_of = timeline.timeline_body

    def slow_body(run, digests, field, role, width, *rest):
        building[0] += 1
        most[0] = max(most[0], building[0])
        widths.append(width)
        time.sleep(0.3)
        building[0] -= 1
        return body_of(run, digests, field, role, width, *rest)

    monkeypatch.setattr(timeline, "timeline_body", slow_body)
    threads = [
        threading.Thread(
            target=gradviz.timeline_impl,
            args=(context.RequestContext(), "", "run"),
            kwargs={"width": width},
        )
        for width in (10, 20, 10, 20)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Each body's arrays are over every layer and step: one at a time, one per width.
    assert most[0] == 1 and sorted(widths) == [10, 20]
