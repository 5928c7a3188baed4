"""Which layers to capture: paths through nested models, the user's choice, pooling geometry.

Backend-neutral: Keras only. `select_layers` turns the callback's `layers=`
argument into `ChosenLayer`s; `pooling_description` gives the geometry that
the layer metadata and the routing record need.
"""

import difflib
import fnmatch
import inspect
from dataclasses import dataclass

import keras

_MAX_POOLING = tuple(
    getattr(keras.layers, name)
    for name in (
        "MaxPooling1D",
        "MaxPooling2D",
        "MaxPooling3D",
        "AdaptiveMaxPooling1D",
        "AdaptiveMaxPooling2D",
        "AdaptiveMaxPooling3D",
    )
    if hasattr(keras.layers, name)
)
_AVERAGE_POOLING = tuple(
    getattr(keras.layers, name)
    for name in (
        "AveragePooling1D",
        "AveragePooling2D",
        "AveragePooling3D",
        "AdaptiveAveragePooling1D",
        "AdaptiveAveragePooling2D",
        "AdaptiveAveragePooling3D",
    )
    if hasattr(keras.layers, name)
)
_GLOBAL_MAX_POOLING = (
    keras.layers.GlobalMaxPooling1D,
    keras.layers.GlobalMaxPooling2D,
    keras.layers.GlobalMaxPooling3D,
)
_GLOBAL_AVERAGE_POOLING = (
    keras.layers.GlobalAveragePooling1D,
    keras.layers.GlobalAveragePooling2D,
    keras.layers.GlobalAveragePooling3D,
)
POOLING_LAYERS = _MAX_POOLING + _AVERAGE_POOLING + _GLOBAL_MAX_POOLING + _GLOBAL_AVERAGE_POOLING

_GLOB_CHARACTERS = frozenset("*?[")


@dataclass
class ChosenLayer:
    """A layer to capture: its path from the root model and its position."""

    path: str
    layer: keras.layers.Layer
    index: int


def walk_layers(model):
    """Returns `(path, layer)` for every layer below `model`, depth first.

    Paths join layer names with "/" from the model's children down, e.g.
    `resnet50/pool1_pool`. Input layers are skipped; a layer reached twice
    (shared) is listed once, at its first path.
    """
    seen = set()
    result = []

    def visit(parent, prefix):
        for child in _children(parent):
            if id(child) in seen or isinstance(child, keras.layers.InputLayer):
                continue
            seen.add(id(child))
            path = f"{prefix}{child.name}"
            result.append((path, child))
            visit(child, path + "/")

    visit(model, "")
    return result


def _children(layer):
    # `_flatten_layers` is how Keras lists sublayers of any layer (models,
    # and plain layers that hold layers); `.layers` only exists on models.
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is not None:
        return list(flatten(include_self=False, recursive=False))
    return list(getattr(layer, "layers", []))


def is_pooling_layer(layer):
    return isinstance(layer, POOLING_LAYERS)


# Float dtypes of 16 bits or fewer (float8 names start so): the block formats' neighbourhood.
_NARROW_FLOATS = ("float16", "bfloat16", "float8")


def block_formats_for(chosen, asked):
    """Whether the events of `chosen` (`ChosenLayer`s) write the block part: `asked`, or for None
    (the default) where it is cheap or to the point: when every chosen layer is a pooling layer
    (the block part adds about 1 % to ResNet50's pooling event and about a quarter to its
    every-layer event: bench/RESULTS.md section 20), or when one computes in a float of 16 bits
    or fewer (`mixed_float16`, `mixed_bfloat16`, float8), a run already in the formats'
    neighbourhood."""
    if asked is not None:
        return asked
    narrow = any(
        str(getattr(c.layer, "compute_dtype", "float32")).startswith(_NARROW_FLOATS) for c in chosen
    )
    return narrow or all(is_pooling_layer(c.layer) for c in chosen)


def check_layer_spec(spec):
    """Returns the layer selection as a list, or None for the default.

    Raises:
      TypeError: an item is not a string, a layer instance, a layer class or
        a predicate (a callable that takes one layer).
      ValueError: the list is empty, or a name is the empty string.
    """
    if spec is None:
        return None
    items = list(spec) if isinstance(spec, (list, tuple, set, frozenset)) else [spec]
    if not items:
        raise ValueError(
            "layers must name at least one layer; pass None to log all pooling layers. "
            f"Received: layers={spec!r}"
        )
    for item in items:
        if isinstance(item, str):
            if not item:
                raise ValueError(f"layers must not hold an empty name. Received: layers={spec!r}")
        elif isinstance(item, type):
            if not issubclass(item, keras.layers.Layer):
                raise TypeError(
                    "layers may hold Keras layer classes (keras.layers.Conv2D, say); "
                    f"{item.__name__} is not one. Received: layers={spec!r}"
                )
        elif not isinstance(item, keras.layers.Layer) and callable(item):
            _check_predicate(item, spec)
        elif not isinstance(item, keras.layers.Layer):
            raise TypeError(
                "layers must be None, a layer name or path, a glob pattern, a Keras "
                "layer instance or class, a predicate, or a list of those. "
                f"Received: layers={spec!r}, holding {item!r} of type {type(item).__name__}"
            )
    return items


def _check_predicate(item, spec):
    try:
        signature = inspect.signature(item)
    except (TypeError, ValueError):
        return  # a builtin without a signature: it is tried on the first layer
    try:
        signature.bind(None)
    except TypeError:
        raise TypeError(
            "layers may hold a predicate, a callable that takes one layer and returns True or "
            f"False; {_callable_name(item)} takes {signature}. Received: layers={spec!r}"
        ) from None


def _callable_name(item):
    return getattr(item, "__qualname__", type(item).__name__)


def select_layers(model, spec):
    """Returns the `ChosenLayer`s of `model` that `spec` asks for, in model order.

    Args:
      model: a built Keras model.
      spec: None (all pooling layers), or a list as returned by
        `check_layer_spec`: exact paths (`"resnet50/pool1_pool"`), bare layer
        names (every layer of that name, at any depth), glob patterns on paths
        (`"resnet50/conv*_out"`), layer instances (at any depth), layer
        classes, or predicates `layer -> bool`.

    Raises:
      ValueError: a name or pattern matches no layer (the message lists the
        nearest names), a layer instance is not in the model, or nothing at
        all is chosen.
      TypeError: a predicate raised on a layer.
    """
    spec = check_layer_spec(spec)
    layers = walk_layers(model)
    indexed = [ChosenLayer(path, layer, i) for i, (path, layer) in enumerate(layers)]
    if spec is None:
        chosen = [c for c in indexed if is_pooling_layer(c.layer)]
        if not chosen:
            raise ValueError(
                f"Model {model.name!r} has no pooling layer, which is what tb_gradviz "
                "logs by default. Choose layers with layers=[...]: names or paths "
                "(e.g. 'conv2d' or 'resnet50/pool1_pool'), glob patterns "
                "('resnet50/conv*_out'), layer classes (keras.layers.Conv2D) or a "
                "predicate (lambda layer: ...)."
            )
        return chosen
    picked = set()
    for item in spec:
        matches = [c for c in indexed if _matches(item, c, spec)]
        if not matches and isinstance(item, str):
            raise ValueError(_no_match_message(model, item, [c.path for c in indexed], spec))
        if not matches and isinstance(item, keras.layers.Layer):
            raise ValueError(
                f"The layer {item.name!r} is not a layer of model {model.name!r} nor of a model "
                f"nested in it. Its layers are: {_preview([c.path for c in indexed])}. "
                f"Received: layers={spec!r}"
            )
        picked.update(c.index for c in matches)
    if not picked:
        raise ValueError(
            f"layers chose no layer of model {model.name!r}. Its layers are: "
            f"{_preview([c.path for c in indexed])}. Received: layers={spec!r}"
        )
    return [c for c in indexed if c.index in picked]


def _matches(item, chosen, spec):
    if isinstance(item, str):
        if _GLOB_CHARACTERS & set(item):
            return fnmatch.fnmatchcase(chosen.path, item)
        return item in (chosen.path, chosen.layer.name)
    if isinstance(item, keras.layers.Layer):
        return chosen.layer is item
    if isinstance(item, type):
        return isinstance(chosen.layer, item)
    try:
        return bool(item(chosen.layer))
    except Exception as e:
        raise TypeError(
            f"layers may hold a predicate, a callable that takes one layer and returns True or "
            f"False; {_callable_name(item)} raised {type(e).__name__}: {e} on layer "
            f"{chosen.path!r}. Received: layers={spec!r}"
        ) from e


def _no_match_message(model, item, paths, spec):
    names = sorted(set(paths) | {p.rsplit("/", 1)[-1] for p in paths})
    nearest = difflib.get_close_matches(item, names, n=5, cutoff=0.5)
    hint = f" Nearest: {', '.join(repr(n) for n in nearest)}." if nearest else ""
    kind = "pattern" if _GLOB_CHARACTERS & set(item) else "name"
    return (
        f"No layer of model {model.name!r} matches the {kind} {item!r}.{hint} "
        f"Layers are named by path from the model, e.g. 'resnet50/pool1_pool': "
        f"{_preview(paths)}. Received: layers={spec!r}"
    )


def _preview(paths, limit=12):
    shown = ", ".join(paths[:limit])
    return shown + (f", ... ({len(paths)} in all)" if len(paths) > limit else "")


def pooling_description(layer):
    """Returns the pooling geometry of a pooling layer as plain data, else None."""
    if not is_pooling_layer(layer):
        return None
    is_global = isinstance(layer, _GLOBAL_MAX_POOLING + _GLOBAL_AVERAGE_POOLING)
    is_max = isinstance(layer, _MAX_POOLING + _GLOBAL_MAX_POOLING)
    pool_size = getattr(layer, "pool_size", None)
    strides = getattr(layer, "strides", None)
    return {
        "type": "max" if is_max else "average",
        "global": is_global,
        "pool_size": None if is_global or pool_size is None else list(pool_size),
        "strides": None if is_global or strides is None else list(strides),
        "padding": "valid" if is_global else getattr(layer, "padding", "valid"),
        "data_format": getattr(layer, "data_format", "channels_last"),
    }


def as_loss(loss):
    """Returns `loss` as a `keras.losses.Loss`, which takes `sample_weight`.

    `keras.losses.get("mse")` returns the plain function `mean_squared_error`,
    which gives one value per example and knows no sample weights; wrapping it
    reduces it the way `compile` does.

    Raises:
      ValueError: Keras does not know the loss (with Keras' own message).
      TypeError: it is not a name, a config dict or a callable, or it
        resolves to a function that does not take `(y_true, y_pred)`.
    """
    allowed = "loss must be None, a Keras loss name, a function (y_true, y_pred) or a Loss"
    if not isinstance(loss, (str, dict)) and not callable(loss):
        raise TypeError(f"{allowed}. Received: loss={loss!r}")
    try:
        resolved = keras.losses.get(loss)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{allowed} ({e}). Received: loss={loss!r}") from None
    if isinstance(resolved, keras.losses.Loss):
        return resolved
    if not callable(resolved):
        raise TypeError(f"{allowed}. Received: loss={loss!r}")
    try:
        inspect.signature(resolved).bind(None, None)
    except TypeError:
        raise TypeError(
            f"{allowed}; {_callable_name(resolved)} does not take (y_true, y_pred). "
            f"Received: loss={loss!r}"
        ) from None
    except ValueError:
        pass  # a builtin without a signature
    return _FunctionLoss(resolved)


class _FunctionLoss(keras.losses.Loss):
    def __init__(self, fn):
        super().__init__(name=getattr(fn, "__name__", "loss"))
        self.fn = fn

    def call(self, y_true, y_pred):
        return self.fn(y_true, y_pred)
