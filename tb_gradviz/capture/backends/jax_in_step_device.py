"""The JAX in-step digest's statistics on an accelerator (`backends.jax_in_step`).

One jitted program per call reads the step's returned tensors where they are
and only the rows leave the device: `in_step.ROW` per tensor, as
`in_step_kernel.row_along` computes it on the host (sums in float64), and
the update norms as `in_step_kernel.update_norms` computes them.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tb_gradviz.capture import in_step


def rows(tensors, units_axes):
    """`[tensors, in_step.ROW]` float64 rows of `tensors`, the dead channels counted along
    each one's units axis (None: none counted)."""
    with jax.enable_x64(True):  # float64 sums of squares, as the kernel's
        found = _rows(list(tensors), tuple(units_axes))
        return np.asarray(jax.device_get(found), np.float64)


def update_norms(after, before):
    """`[weights, 2]` float64: per weight `|w_after|` and `|w_after - w_before|`, summed in
    float64 (float16 and bfloat16 widened exactly)."""
    with jax.enable_x64(True):
        found = _update_norms(list(after), list(before))
        return np.asarray(jax.device_get(found), np.float64)


@jax.jit
def _update_norms(after, before):
    pairs = []
    for a, b in zip(after, before):
        a, b = (_wide(t).astype(jnp.float64).reshape(-1) for t in (a, b))
        pairs.append(jnp.sqrt(jnp.stack([jnp.sum(a * a), jnp.sum(jnp.square(a - b))])))
    return jnp.stack(pairs) if pairs else jnp.zeros((0, 2), jnp.float64)


def _wide(t):
    # float16 and bfloat16 widen to float32 exactly; float32 and float64 stay.
    return t if t.dtype in (jnp.float32, jnp.float64) else t.astype(jnp.float32)


@functools.partial(jax.jit, static_argnums=1)
def _rows(tensors, units_axes):
    return jnp.stack([_row(t, axis) for t, axis in zip(tensors, units_axes)])


def _row(x, units_axis):
    x = x.astype(jnp.float32)  # float16 and bfloat16 exactly, float64 rounded: the kernel's
    finite = jnp.isfinite(x)
    magnitudes = jnp.where(finite, jnp.abs(x), jnp.inf)

    def count(mask, axis=None):
        return jnp.sum(mask, axis=axis, dtype=jnp.int64).astype(jnp.float64)

    below = [count(magnitudes < t) for t in in_step.THRESHOLDS]
    nonfinite = [count(jnp.isnan(x)), count(x == jnp.inf), count(x == -jnp.inf)]
    squares = jnp.sum(jnp.where(finite, jnp.square(x.astype(jnp.float64)), 0.0))
    largest = jnp.max(jnp.where(finite, jnp.abs(x), 0.0), initial=0.0).astype(jnp.float64)
    dead = jnp.zeros((), jnp.float64)
    if units_axis is not None:
        others = tuple(a for a in range(x.ndim) if a != units_axis)
        dead = count(~jnp.any(x != 0, axis=others))
    return jnp.stack([jnp.float64(x.size), *below, *nonfinite, squares, largest, dead])
