"""Query arguments: one parser per kind of value, one error for each way a value can be wrong.

Every route reads its arguments through `arguments`, and each argument's text
through its parser in `PARSERS`: nowhere else in the board is query text
turned into a value. A value is wrong in one of three ways, each with its
error (TensorBoard's `InvalidArgumentError`, answered as a 400): missing,
given more than once, or not one of the values allowed; the message names
the argument, what is allowed and what was received. Numbers are written in
ASCII digits only (`int()` and `float()` also take other scripts' digits,
`"1_0"`, `" 5"` and `"²"`, or refuse them with a `ValueError`) and are at
most `MAX_NUMBER_CHARS` long, so that parsing one is cheap and never fails.
"""

import math
import re

from tensorboard import errors

from tb_gradviz.board import timeline
from tb_gradviz.format import records

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# The longest number read: every value allowed fits (a step clamped to int64
# has 19 digits), and `int()` of more than 4300 digits raises.
MAX_NUMBER_CHARS = 40

# Of a received value, the error message quotes this many characters.
_SHOWN_CHARS = 40

_INTEGER = re.compile(r"-?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _received(text):
    """`text` as an error quotes it: whole, or its first characters and its length."""
    if len(text) <= _SHOWN_CHARS:
        return repr(text)
    return f"{text[:_SHOWN_CHARS]!r}... ({len(text)} characters)"


def missing(name):
    """The error of a required argument that the query lacks."""
    return errors.InvalidArgumentError(f"missing query argument {name!r}")


def repeated(name, count):
    """The error of an argument given `count` (> 1) times."""
    return errors.InvalidArgumentError(f"query argument {name!r} given {count} times; give it once")


def not_allowed(name, allowed, text):
    """The error of an argument whose text `text` is not one of the values `allowed` describes."""
    return errors.InvalidArgumentError(f"{name} must be {allowed}; received {_received(text)}")


def _integer(text):
    """`text` as an int, or None when it is not an optional minus and ASCII digits, short."""
    if len(text) > MAX_NUMBER_CHARS or not _INTEGER.fullmatch(text):
        return None
    return int(text)


def name(text):
    """A run, layer or tensor name: any text (an unknown one is a 404, not a 400)."""
    return text


def _step_named(argument):
    def parse(text):
        value = _integer(text)
        if value is None:
            raise not_allowed(
                argument, f"a decimal integer of at most {MAX_NUMBER_CHARS} characters", text
            )
        return min(max(value, INT64_MIN), INT64_MAX)

    return parse


step = _step_named("step")
step.__doc__ = """A step: a decimal integer, clamped to int64 (steps are int64; a route takes the
latest step at or before it)."""
start = _step_named("start")
start.__doc__ = """The first step of a range (`/timeline`): a decimal integer, clamped to int64."""
end = _step_named("end")
end.__doc__ = """The last step of a range (`/timeline`): a decimal integer, clamped to int64."""


def width(text):
    """A number of columns: a whole number from 1 to `timeline.MAX_WIDTH`."""
    value = _integer(text)
    if value is None or not 1 <= value <= timeline.MAX_WIDTH:
        raise not_allowed("width", f"a whole number from 1 to {timeline.MAX_WIDTH}", text)
    return value


def ratio(text):
    """The flags' vanishing / exploding ratio: a finite decimal number above 1."""
    value = float(text) if len(text) <= MAX_NUMBER_CHARS and _DECIMAL.fullmatch(text) else math.nan
    if not 1 < value < math.inf:
        raise not_allowed(
            "ratio",
            f"a finite number above 1, in decimal of at most {MAX_NUMBER_CHARS} characters",
            text,
        )
    return value


def _choice(argument, allowed):
    def parse(text):
        if text not in allowed:
            raise not_allowed(argument, f"one of {', '.join(allowed)}", text)
        return text

    parse.__doc__ = f"`{argument}`: one of {', '.join(allowed)}."
    return parse


field = _choice("field", timeline.FIELDS)
role = _choice("role", records.ROLES)

# The parser of each argument a route takes.
PARSERS = {
    "run": name,
    "layer": name,
    "tensor": name,
    "step": step,
    "start": start,
    "end": end,
    "width": width,
    "ratio": ratio,
    "field": field,
    "role": role,
}


def _single(args, argument):
    """The text of `argument` given at most once in `args` (a werkzeug `MultiDict`), or None."""
    values = args.getlist(argument)
    if len(values) > 1:
        raise repeated(argument, len(values))
    return values[0] if values else None


def arguments(args, required=(), optional=()):
    """Parses a request's query arguments.

    Args:
      args: the request's `args` (a werkzeug `MultiDict`).
      required: names of `PARSERS` the query must give.
      optional: names of `PARSERS` it may give.

    Returns:
      `(values of required, {name: value} of the optional ones given)`;
      other arguments are ignored.

    Raises:
      InvalidArgumentError: an argument missing (`missing`), repeated
        (`repeated`) or not allowed (`not_allowed`).
    """
    values = []
    for argument in required:
        text = _single(args, argument)
        if text is None:
            raise missing(argument)
        values.append(PARSERS[argument](text))
    given = {}
    for argument in optional:
        text = _single(args, argument)
        if text is not None:
            given[argument] = PARSERS[argument](text)
    return values, given
