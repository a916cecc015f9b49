"""scaleout's errors as TensorFlow errors too, as Horovod's TensorFlow ops raise them.

Every error raised through scaleout.tensorflow is an instance of its scaleout class (so
`except scaleout.MismatchError` works) and of the tf.errors class Horovod 0.28.1 raises in the
same case (so a script's `except tf.errors.FailedPreconditionError` works). Horovod turns its
core's statuses into TensorFlow statuses one for one: a precondition error (ranks disagree about
a collective; a collective that cannot run while a rank has joined; not initialized) becomes
FailedPreconditionError, a bad argument (also a name already in flight) InvalidArgumentError, and
the rest, shutdown included, UnknownError. The classes below follow that table; scaleout's own
statuses without a Horovod counterpart take the nearest tf.errors class (a timeout:
DeadlineExceededError; a broken invariant: InternalError).

Note [TF error types]
Where the conversion happens:
- Eagerly and while a tf.function is traced, the shim's entry points convert a scaleout error as
  it passes (`tf_errors`). These classes keep OpError's __init__(node_def, op, message), which is
  what autograph needs to re-raise them from a traced function as themselves.
- While a graph runs, a collective is a numpy_function, and TensorFlow reports an exception
  raised inside one as a status whose code depends only on Python's built-in classes (mostly
  UnknownError), then builds the OpError itself, from that code. Two places see it on its way
  out: the eager context's call_function, which runs tf.function graphs, and Session.run for TF1
  graphs. `install()` wraps those
  two places so that an error whose message names one of the classes below (the numpy_function
  raised it; its message carries its class name) becomes that class. Everything else passes
  through untouched. Should TensorFlow move those functions, install() leaves them alone and
  graph errors keep TensorFlow's class, with the scaleout message.
"""

from __future__ import annotations

import functools
import re
from typing import Optional, Type

import tensorflow as tf

from scaleout import _errors
from scaleout._errors import NotYetImplementedError

__all__ = ["TF_CLASSES", "UnsupportedError", "typed", "tf_errors", "install"]


def _dual(scaleout_cls: type, tf_cls: type, name: str, joined: bool = False) -> type:
    def __init__(self, node_def, op, message, *args):
        tf_cls.__init__(self, node_def, op, message, *args)

    def __str__(self):
        return tf_cls.__str__(self)

    doc = (
        f"{scaleout_cls.__name__} raised through scaleout.tensorflow: also a "
        f"tf.errors.{tf_cls.__name__}, as Horovod's TensorFlow ops raise it."
    )
    cls = type(
        name,
        (scaleout_cls, tf_cls),
        {"__init__": __init__, "__str__": __str__, "__doc__": doc, "__module__": __name__},
    )
    return cls


class UnsupportedError(_errors.InvalidArgumentError, NotImplementedError):
    """An argument combination that Horovod also refuses with NotImplementedError (e.g. Max on
    a tf.IndexedSlices)."""


# scaleout class -> its TensorFlow-typed subclass. Subclasses first: typed() takes the first
# class the error is an instance of.
_TABLE = [
    (UnsupportedError, tf.errors.InvalidArgumentError),
    (_errors.NoGradientError, tf.errors.InvalidArgumentError),
    (_errors.InvalidArgumentError, tf.errors.InvalidArgumentError),
    (_errors.DuplicateNameError, tf.errors.InvalidArgumentError),
    (_errors.NotInitializedError, tf.errors.FailedPreconditionError),
    (_errors.MismatchError, tf.errors.FailedPreconditionError),
    (_errors.ShutDownError, tf.errors.UnknownError),
    (_errors.TransportError, tf.errors.UnknownError),
    (_errors.PeerFailedError, tf.errors.UnknownError),
    (_errors.ScaleoutTimeoutError, tf.errors.DeadlineExceededError),
    (_errors.InternalError, tf.errors.InternalError),
    (NotYetImplementedError, tf.errors.UnimplementedError),
    (_errors.ScaleoutError, tf.errors.UnknownError),
]
TF_CLASSES = {base: _dual(base, tf_base, f"TF{base.__name__}") for base, tf_base in _TABLE}

# Horovod reports a collective that cannot run while a rank has joined as a precondition error;
# scaleout's core reports it as a bad argument (INVALID_ARGUMENT) whose message says "joined".
JoinedError = _dual(
    _errors.InvalidArgumentError, tf.errors.FailedPreconditionError, "TFJoinedError"
)
_JOINED = re.compile(r"cannot run while ranks? [0-9, and]+ ha(?:s|ve) joined: as in Horovod")

_BY_NAME = {cls.__name__: cls for cls in [*TF_CLASSES.values(), JoinedError]}
# How a numpy_function's exception appears in the graph error's message (its traceback's last
# line): "scaleout.tensorflow._errors.TFMismatchError: <message>".
_IN_MESSAGE = re.compile(re.escape(__name__) + r"\.(TF\w+): ")


def _class_for(error: BaseException) -> Optional[Type[BaseException]]:
    if isinstance(error, _errors.InvalidArgumentError) and _JOINED.search(str(error)):
        return JoinedError
    for base, _ in _TABLE:
        if isinstance(error, base):
            return TF_CLASSES[base]
    return None


def typed(error: BaseException) -> BaseException:
    """The TensorFlow-typed version of a scaleout error (the error itself if it already is one,
    or is not a scaleout error)."""
    if isinstance(error, tf.errors.OpError):
        return error
    cls = _class_for(error)
    if cls is None:
        return error
    converted = cls(None, None, str(error))
    converted.__traceback__ = error.__traceback__
    return converted


def tf_errors(fn):
    """Decorator for the shim's entry points: scaleout errors leave as their TF-typed class."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _errors.ScaleoutError as e:
            converted = typed(e)
            if converted is e:
                raise
            raise converted.with_traceback(e.__traceback__) from None

    return tf.autograph.experimental.do_not_convert(wrapper)


# Python's words between chained exceptions in a traceback: only what follows the last of them
# is the exception the numpy_function ended with.
_CHAINED = re.compile(
    r"During handling of the above exception, another exception occurred:|"
    r"The above exception was the direct cause of the following exception:"
)


def _class_in_message(message) -> Optional[type]:
    """The scaleout class of the exception a graph's numpy_function ended with, if it was one
    (not one it merely handled on the way to raising another)."""
    text = _CHAINED.split(str(message))[-1]
    found = _IN_MESSAGE.findall(text)
    return _BY_NAME.get(found[-1]) if found else None


def _retyped(error: tf.errors.OpError) -> tf.errors.OpError:
    cls = _class_in_message(error.message)
    if cls is None or isinstance(error, cls):
        return error
    converted = cls(error.node_def, error.op, error.message)
    converted.__traceback__ = error.__traceback__
    return converted


def _retyping(fn):
    """fn, whose OpErrors that carry a scaleout class name leave as that class."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except tf.errors.OpError as e:
            converted = _retyped(e)
            if converted is e:
                raise
            raise converted from None

    return wrapper


_installed = False


def install() -> None:
    """Wraps the two places TensorFlow builds an OpError from a failed graph (see the module
    docstring). Idempotent."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        from tensorflow.python.eager import context as context_module

        context_module.Context.call_function = _retyping(context_module.Context.call_function)
    except (ImportError, AttributeError):  # pragma: no cover - depends on TF's internals
        pass
    try:
        from tensorflow.python.client import session as session_module

        session_module.BaseSession._do_call = _retyping(session_module.BaseSession._do_call)
    except (ImportError, AttributeError):  # pragma: no cover
        pass
