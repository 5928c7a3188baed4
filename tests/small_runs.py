"""Small runs that several test files log and read back."""

import numpy as np


def fit_weights_cnn(log_dir, seed, batch, probe_batch, steps_per_epoch, epochs, weights=True):
    """Fits a small CNN on noise with every layer logged once an epoch, `weights=True` by default.

    Conv2D (ReLU) "conv", BatchNormalization "bn", MaxPooling2D "pool",
    Flatten "flatten", Dense(3) "head": three layers with weights among five.
    """
    import keras

    import tb_gradviz

    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch * steps_per_epoch, 8, 8, 3)).astype("float32")
    y = rng.integers(0, 3, size=len(x))
    model = keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.MaxPooling2D(2, name="pool"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(3, name="head"),
        ]
    )
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    callback = tb_gradviz.GradVizCallback(
        log_dir, (x[:probe_batch], y[:probe_batch]), layers=["*"], weights=weights
    )
    model.fit(x, y, batch_size=batch, epochs=epochs, callbacks=[callback], verbose=0)
