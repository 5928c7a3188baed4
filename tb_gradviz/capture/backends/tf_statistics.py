"""The statistics of captured tensors on a TensorFlow device: `device_statistics`, compiled by XLA.

The TensorFlow pass calls `compiled(groups, scaled)` inside its own
`tf.function`: the tensors packed into chunks by the pass's graph, then
nested `tf.function(jit_compile=True)`s, one per distinct chunk, so that XLA
fuses each chunk's two reads into reductions, as on JAX, instead of
TensorFlow running one kernel per op and materialising every comparison.
Only sums and counts leave the device.
"""

import tensorflow as tf

from tb_gradviz.capture import device_programs


def compiled(groups, scaled, mode="fused", widths=None):
    """The XLA-compiled `device_statistics.chunk_statistics` of tensors grouped as `groups`.

    Args:
      groups: `device_statistics.chunks`' lists of indices into the tensors.
      scaled: per tensor, whether the divisor (the loss scale) divides it.
      mode: `"fused"` on an accelerator, `"stepped"` on the CPU
        (`device_statistics.mode_for`).
      widths: None, or per tensor the length of its last axis: the block
        record too (`device_statistics.chunk_statistics`).

    Returns:
      A function of `(tensors, divisor)`, divisor a float64 scalar, that
      returns a list of dicts, one per group: the tensors packed into
      chunks, each through a nested `tf.function` compiled by XLA, one per
      distinct chunk (`device_programs.GroupPrograms`).
    """
    programs = device_programs.GroupPrograms(_compile, mode, compile_packing=False)

    def statistics(tensors, divisor):
        return programs(groups, scaled, tensors, divisor, widths)

    statistics.programs = programs
    return statistics


def _compile(function):
    return tf.function(function, jit_compile=True, autograph=False)


def divide(x, y):
    """`x / y`, correctly rounded even when `y` is a constant.

    In a tf.function, Grappler rewrites division by a constant into
    multiplication by its reciprocal, which can differ in the last bit.
    DivNoNan is not rewritten; `y` is never zero here.
    """
    return tf.math.divide_no_nan(x, y)
