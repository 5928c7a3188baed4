"""The device statistics compiled: one program per distinct chunk of the packed tensors.

Imports keras only through the modules it composes.
"""

from tb_gradviz.capture import device_packing, device_statistics


class GroupPrograms:
    """`device_statistics.chunk_statistics`, with one compiled program per distinct chunk.

    The tensors are packed into chunks of a few shapes (`device_packing`):
    the statistics' program depends only on a chunk's dtype, rows and slots,
    so an event of any number of layers runs a few programs, each compiled
    once (XLA takes seconds per program). `traces` counts the statistics'
    programs traced, `pack_traces` the packing's (one per distinct list of
    tensor shapes in a chunk: reshapes, pads and a concatenation).

    Args:
      compile: wraps a function into its compiled form (`jax.jit`, or
        `tf.function` with `jit_compile=True`), which traces it once per
        signature of its arguments.
      mode, precision: as for `device_statistics.group_statistics`.
      compile_packing: whether to compile the packing too (JAX, where each
        eager op is compiled anyway); TensorFlow runs it in the caller's graph.
    """

    def __init__(self, compile, mode="fused", precision=True, compile_packing=True):
        self.compile, self.mode, self.precision = compile, mode, precision
        self.compile_packing = compile_packing
        self.programs, self.packings = {}, {}
        self.traces = self.pack_traces = 0

    def __call__(self, groups, scaled, tensors, divisor, widths=None):
        """`device_statistics.chunk_statistics(groups, scaled, tensors, divisor, mode, precision,
        widths)`."""
        blocks = widths is not None
        return device_packing.run(
            groups,
            scaled,
            tensors,
            divisor,
            widths,
            device_statistics.CHUNK_VALUES,
            self._pack,
            self._statistics(blocks),
        )

    def _pack(self, chunk, tensors, after):
        if not self.compile_packing:
            return device_packing.pack(chunk, tensors, after)
        key = (chunk.key, tuple(chunk.spans), tuple(tuple(t.shape) for t in tensors))
        if key not in self.packings:

            def pack(tensors, after):
                self.pack_traces += 1
                return device_packing.pack(chunk, tensors, after)

            self.packings[key] = self.compile(pack)
        return self.packings[key](tensors, after)

    def _statistics(self, blocks):
        def run(chunk, buffer, data, divisor):
            key = (chunk.key, blocks)
            if key not in self.programs:
                self.programs[key] = self.compile(self._program(chunk.slots, blocks))
            return self.programs[key](buffer, data, divisor)

        return run

    def _program(self, slots, blocks):
        def statistics(buffer, data, divisor):
            self.traces += 1
            return device_statistics.packed_statistics(
                buffer, data, divisor, slots, self.mode, self.precision, blocks
            )

        return statistics
