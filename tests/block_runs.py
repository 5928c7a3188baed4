"""A small run whose gradients lose half their values in MXFP8 and keep them in float32."""

import numpy as np

WIDTH = 16
PROBE = 8


def fit_spread(log_dir, epochs=2):
    """Fits a Dense network logged with every layer, once an epoch (2 steps each).

    Dense(16, tanh) "d1", then "spread", which multiplies the odd channels by
    2**-30: its activation and the gradient it passes back (its input
    gradient, d1's output gradient) hold, in each row of 16 values (one block
    of MX's 32, one of NVFP4's 16), eight values 2**30 below the others,
    which MXFP8 turns to zero; then Dense(16, tanh) "d2" and Dense(3) "head".
    """
    import keras

    import tb_gradviz

    factor = np.where(np.arange(WIDTH) % 2, 2.0**-30, 1.0).astype("float32")

    class Spread(keras.layers.Layer):
        def call(self, x):
            return x * keras.ops.convert_to_tensor(factor)

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 6)).astype("float32")
    y = rng.normal(size=(32, 3)).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(WIDTH, activation="tanh", name="d1"),
            Spread(name="spread"),
            keras.layers.Dense(WIDTH, activation="tanh", name="d2"),
            keras.layers.Dense(3, name="head"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.01), "mse")
    callback = tb_gradviz.GradVizCallback(
        log_dir, (x[:PROBE], y[:PROBE]), layers=["d1", "spread", "d2", "head"], block_formats=True
    )
    model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, callbacks=[callback])
