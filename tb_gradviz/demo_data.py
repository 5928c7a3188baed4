"""The demos' generated images: four kinds of pattern, deterministic for a seed (no download).

Horizontal stripes, vertical stripes, a disc and a checkerboard, in random
colours, positions and scales, with noise. `demos` trains its CNNs on them;
the tests and the bench draw their probe batches from them too.
"""

import numpy as np

PATTERNS = ("horizontal stripes", "vertical stripes", "disc", "checkerboard")


def pattern_images(count, size, seed=0):
    """Returns `(x, y)`: `count` float32 images `[size, size, 3]` in [0, 1], int labels.

    Deterministic for a given seed; classes cycle so every batch has all four.
    """
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % len(PATTERNS)
    rows, cols = np.mgrid[0:size, 0:size].astype(np.float32) / size
    images = np.empty((count, size, size, 3), np.float32)
    for i, label in enumerate(labels):
        period = rng.uniform(0.08, 0.3)
        phase = rng.uniform(0, 1)
        if label == 0:
            mask = np.sin(2 * np.pi * (rows / period + phase)) > 0
        elif label == 1:
            mask = np.sin(2 * np.pi * (cols / period + phase)) > 0
        elif label == 2:
            cy, cx, radius = rng.uniform(0.3, 0.7), rng.uniform(0.3, 0.7), rng.uniform(0.15, 0.3)
            mask = (rows - cy) ** 2 + (cols - cx) ** 2 < radius**2
        else:
            mask = (np.floor(rows / period + phase) + np.floor(cols / period + phase)) % 2 == 0
        foreground, background = rng.uniform(0, 1, 3), rng.uniform(0, 1, 3)
        image = np.where(mask[..., None], foreground, background)
        images[i] = np.clip(image + rng.normal(0, 0.05, image.shape), 0, 1)
    return images, labels.astype(np.int32)
