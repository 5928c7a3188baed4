"""tb_gradviz: activations and gradients of Keras layers, in a TensorBoard tab.

The package root imports neither TensorFlow nor Keras (TensorBoard imports
every installed plugin at start); `GradVizCallback` is loaded on first use.
"""

__version__ = "0.1.0"

__all__ = ["GradVizCallback", "__version__"]


def __getattr__(name):
    if name == "GradVizCallback":
        from tb_gradviz.capture.callback import GradVizCallback

        return GradVizCallback
    raise AttributeError(f"module 'tb_gradviz' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"GradVizCallback"})
