"""The host kernel of the block record against its numpy definition, format by format."""

import numpy as np
import pytest
from test_block_formats import edges

from tb_gradviz.capture import block_counts
from tb_gradviz.format import blocks


def assert_same(values, name):
    want = blocks.block_record(values, name)
    got = block_counts.block_record(values, name)
    assert {k: got[k] for k in blocks.COUNTS[:6]} == {k: want[k] for k in blocks.COUNTS[:6]}
    for key in ("squared_error", "squared_sum"):
        assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-300)
    return got


def mixed_tensor(shape, seed):
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(shape) * np.exp(rng.uniform(-30, 30, shape))).astype(np.float32)
    flat = values.reshape(-1)
    flat[rng.random(flat.size) < 0.3] = 0
    flat[rng.random(flat.size) < 0.01] = np.float32(1e-41)  # float32 subnormals
    if flat.size > 40:
        flat[7], flat[40] = np.nan, -np.inf
    return values


@pytest.mark.parametrize("name", sorted(blocks.FORMATS))
def test_rounding_edges(name):
    assert assert_same(edges(name), name)["to_zero"] > 0


@pytest.mark.parametrize("name", sorted(blocks.FORMATS))
@pytest.mark.parametrize("shape", [(), (5,), (3, 47), (4, 2, 64), (2, 0)])
def test_tensors_with_zeros_subnormals_and_nonfinite_values(name, shape):
    assert_same(mixed_tensor(shape, len(shape) + len(name)), name)


def test_an_unknown_format_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"Unknown block format 'fp8'.*nvfp4"):
        block_counts.block_record(np.ones(3, np.float32), "fp8")
