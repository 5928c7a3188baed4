"""Fits small models with GradVizCallback under tf.distribute, in a process of its own.

Devices and clusters are fixed when TensorFlow initialises, so
tests/test_distribution.py runs this script in subprocesses:

    python distributed_fit.py mirrored OUT_DIR
        two logical CPU devices, MirroredStrategy;
    python distributed_fit.py worker OUT_DIR     (with TF_CONFIG set)
        one worker of a MultiWorkerMirroredStrategy cluster.

It writes event files and reference arrays under OUT_DIR and prints one line
`RESULT <json>`; the test asserts on those.
"""

import hashlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from autodiff import tracing_count  # noqa: E402

from tb_gradviz import GradVizCallback  # noqa: E402

layers = keras.layers


def cnn(dropout):
    """conv -> BatchNorm -> ReLU [-> Dropout] -> MaxPool -> Dense, with a metric."""
    keras.utils.set_random_seed(7)
    body = [
        keras.Input((8, 8, 3)),
        layers.Conv2D(4, 3, padding="same", name="conv"),
        layers.BatchNormalization(name="bn"),
        layers.ReLU(name="relu"),
    ]
    if dropout:
        body.append(layers.Dropout(0.5, name="drop"))
    body += [
        layers.MaxPooling2D(name="pool"),
        layers.Flatten(name="flat"),
        layers.Dense(2, name="dense"),
    ]
    model = keras.Sequential(body, name="cnn")
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
    return model


def data(n=32):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 8, 8, 3)).astype("float32"), rng.normal(size=(n, 2)).astype(
        "float32"
    )


def dataset(x, y, batch_size):
    # Each worker reads the whole dataset and takes its share of every batch.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).with_options(options)


def work_around_keras_multi_worker_fit(model, strategy, x, y):
    """Works around two Keras 3 bugs that stop `fit` under MultiWorkerMirroredStrategy.

    keras-team/keras#20585 (open). Neither involves tb_gradviz:
    - `fit` first builds the compiled metrics on a batch of the distributed
      dataset averaged with `strategy.reduce`, which fails ("Attempt to
      convert a value (PerReplica...) to a Tensor"); the model is built
      already, so the metrics are built on a plain local batch instead;
    - each step averages the scalar logs over workers with
      `strategy.reduce("MEAN", v, axis=0)`, which fails on a scalar
      ("Invalid reduction dimension 0"); `axis=None` averages them.
    """
    from keras.src.backend.tensorflow import trainer

    def symbolic_build(iterator=None, data_batch=None):
        with strategy.scope():
            model._symbolic_build(data_batch=(x, y))

    model._maybe_symbolic_build = symbolic_build
    if not getattr(trainer.reduce_per_replica, "work_around", False):
        original = trainer.reduce_per_replica

        def reduce_per_replica(values, strategy, reduction="auto"):
            if reduction in ("auto", "mean") and isinstance(
                strategy, tf.distribute.MultiWorkerMirroredStrategy
            ):
                return keras.tree.map_structure(
                    lambda v: strategy.reduce("MEAN", v, axis=None), values
                )
            return original(values, strategy, reduction)

        reduce_per_replica.work_around = True
        trainer.reduce_per_replica = reduce_per_replica


def local_state(model, strategy):
    """Every local copy of every model, metric and optimizer variable, with a name."""
    result = []
    for v in model.variables + model.metrics_variables + model.optimizer.variables:
        for i, component in enumerate(strategy.experimental_local_results(v.value)):
            result.append((f"{v.path}[{i}]", np.array(component.read_value())))
    return result


def fit_twice_and_compare(strategy, x, y, log_dir, fit_kwargs):
    """Fits the same model without and with the callback; compares every local copy."""
    runs = []
    for with_callback in (False, True):
        with strategy.scope():
            model = cnn(dropout=True)
        callbacks = []
        if with_callback:
            # With weights=True: the weights' gradients and the update copies leave
            # every replica's copy as it was too.
            callbacks.append(
                GradVizCallback(
                    log_dir,
                    (x[:8], y[:8]),
                    layers=["conv", "bn", "pool", "dense"],
                    every_n_batches=1,
                    weights=True,
                )
            )
        keras.utils.set_random_seed(11)
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            work_around_keras_multi_worker_fit(model, strategy, x[:4], y[:4])
        model.fit(dataset(x, y, 8), epochs=2, verbose=0, callbacks=callbacks, **fit_kwargs)
        follow_up = [float(tf.random.uniform(())), float(keras.random.uniform(()))]
        runs.append((local_state(model, strategy), follow_up))
    # Synchronous training: every worker ends with the same trainable weights.
    trained = b"".join(np.array(v.value.read_value()).tobytes() for v in model.trainable_variables)
    (without, rng_without), (with_, rng_with) = runs
    mismatches = [a for (a, va), (_, vb) in zip(without, with_) if not np.array_equal(va, vb)]
    replica_copies_differ = False
    copies = dict(without)
    if "cnn/bn/moving_mean[1]" in copies:
        replica_copies_differ = not np.array_equal(
            copies["cnn/bn/moving_mean[0]"], copies["cnn/bn/moving_mean[1]"]
        )
    return {
        "trainable_sha256": hashlib.sha256(trained).hexdigest(),
        "variables": len(without),
        "same_count": len(without) == len(with_),
        "mismatches": mismatches,
        "rng_identical": rng_without == rng_with,
        "replica_copies_differ": replica_copies_differ,
    }


def reference(model, x, y):
    """The pool's activation, input and output gradient, by hand, on one device.

    The probe batch goes through the layers at once (BatchNorm takes the
    statistics of the whole batch), and the loss is the batch's mean squared
    error, as without any strategy.
    """
    with tf.GradientTape(persistent=True) as tape:
        h = tf.convert_to_tensor(x)
        for layer in model.layers:
            if layer.name == "pool":
                pool_input = h
                tape.watch(pool_input)
                h = layer(h, training=True)
                activation = h
                tape.watch(activation)
            else:
                h = layer(h, training=True)
        loss = tf.reduce_mean(tf.square(h - y))
    input_gradient, output_gradient = tape.gradient(loss, [pool_input, activation])
    return {
        "activation": activation.numpy(),
        "input_gradient": input_gradient.numpy(),
        "output_gradient": output_gradient.numpy(),
    }


def mirrored(out_dir):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    x, y = data()
    result = {"replicas": strategy.num_replicas_in_sync}
    result["identical"] = fit_twice_and_compare(
        strategy, x, y, os.path.join(out_dir, "identical"), {}
    )

    # What is logged: one fit outside the scope, then the same probe again
    # from inside the scope, with the weights left as they are.
    with strategy.scope():
        model = cnn(dropout=False)
    probe = (x[:8], y[:8])
    outside = GradVizCallback(os.path.join(out_dir, "outside"), probe)
    model.fit(dataset(x, y, 8), epochs=1, verbose=0, callbacks=[outside])
    inside = GradVizCallback(os.path.join(out_dir, "inside"), probe)
    inside.set_model(model)
    with strategy.scope():
        inside.log_now()
        inside.on_train_end()
    result["collective_ops"] = outside._capture.collective_ops(*outside._probe)
    result["tracing_count"] = tracing_count(outside._capture)
    np.savez(os.path.join(out_dir, "reference.npz"), **reference(model, *probe))
    return result


def worker(out_dir):
    cluster = json.loads(os.environ["TF_CONFIG"])
    index = cluster["task"]["index"]
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=60)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    x, y = data()
    # The log directory is shared by the workers, as on a shared file system.
    result = fit_twice_and_compare(strategy, x, y, os.path.join(out_dir, "logs"), {})
    result.update(
        index=index,
        pid=os.getpid(),
        replicas=strategy.num_replicas_in_sync,
        writes=bool(strategy.extended.should_save_summary),
    )
    return result


def main():
    mode, out_dir = sys.argv[1], sys.argv[2]
    if mode == "mirrored":
        # Before anything runs: TensorFlow fixes its devices when it first needs them.
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )
    result = mirrored(out_dir) if mode == "mirrored" else worker(out_dir)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
