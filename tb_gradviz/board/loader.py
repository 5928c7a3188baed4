"""The GradViz plugin's loader, TensorBoard's entry point: it keeps the digest and the full records.

TensorBoard keeps a sample of each series of a plugin it does not know (10
steps with `--load_fast=false`, 100 with the Rust data server) unless
`--samples_per_plugin` names the plugin. The digest (`digest.PLUGIN_NAME`)
is a few tens of bytes per tensor and step, and the flags, `/onset`,
`/timeline` and the flow view judge every step from it, so a plain
`tensorboard --logdir LOGS` must keep it whole. The full records
(`metadata.PLUGIN_NAME`) are kept whole too: the callback writes them at a
bounded schedule of events (`full_records=`, about N + sqrt(2 x events)) and
at each flag's onset and the event before, and a sample would drop the very
events an onset names, which the layer view must show. TensorBoard calls each
loader's `fix_flags` after parsing its flags and before it starts the data
server or the multiplexer, which read `samples_per_plugin`; this is the one
place a plugin can set it.

The loader lives apart from the plugin, as TensorBoard recommends, so that
it imports nothing but TensorBoard's base plugin and the format's names.
"""

from tensorboard.plugins import base_plugin

from tb_gradviz.format import digest, metadata

# `--samples_per_plugin` value that keeps every point of a series.
KEEP_ALL = 0


class GradVizLoader(base_plugin.TBLoader):
    """Loads `GradVizPlugin`, with the digest's series kept whole unless the user says otherwise."""

    def fix_flags(self, flags):
        """Sets `samples_per_plugin` of the digest and of the full records to `KEEP_ALL`, each
        unless the user set it.

        TensorBoard parses `--samples_per_plugin` into a `{plugin: samples}`
        dict (empty without the flag); a value the user gives for either
        plugin wins (`--samples_per_plugin=gradviz=N` samples the full records
        of a run logged with `full_records="all"`). The dict is replaced, never
        changed in place, so that a dict passed to
        `program.TensorBoard.configure` stays as it was.
        """
        samples = dict(getattr(flags, "samples_per_plugin", None) or {})
        samples.setdefault(digest.PLUGIN_NAME, KEEP_ALL)
        samples.setdefault(metadata.PLUGIN_NAME, KEEP_ALL)
        flags.samples_per_plugin = samples

    def load(self, context):
        from tb_gradviz.board.plugin import GradVizPlugin

        return GradVizPlugin(context)
