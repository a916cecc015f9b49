"""One exception hierarchy for every failure the core or the Python layer reports.

Each status code of the native core maps to one class through the code's name, which the
C header's table provides (the binding registers these classes by name, once), so no code number
is copied here by hand.
"""

from __future__ import annotations

from typing import Optional

from scaleout import _rank_report


class ScaleoutError(RuntimeError):
    """Base class of every scaleout error.

    Errors from the core carry Note [Error details] (native/common/status.h) as data:
    `culprit_ranks`, the job's ranks whose death or shutdown caused the error (empty when no rank
    is to blame), and `process_set_id`, the existing process set an add_process_set's ranks
    already form (else None)."""

    # TensorFlow's autograph re-raises an error from a traced function as its own type only when
    # the type's __init__ is Exception.__init__; RuntimeError's would turn ours into StagingError.
    __init__ = Exception.__init__
    culprit_ranks: "tuple[int, ...]" = ()
    process_set_id: Optional[int] = None


class InvalidArgumentError(ScaleoutError, ValueError):
    """Bad input on this rank: dtype, shape, op, root rank, ..."""


class NoGradientError(InvalidArgumentError, NotImplementedError):
    """A collective's gradient is not defined for the arguments it ran with (e.g. op=Max)."""


class NotYetImplementedError(ScaleoutError, NotImplementedError):
    """A Horovod feature scaleout does not have yet (or not for these arguments), raised where
    Horovod raises NotImplementedError or where the feature is used."""


class NotInitializedError(ScaleoutError, ValueError):
    """A collective or query was used before scaleout.init() or after shutdown() (a ValueError,
    as Horovod's "Horovod has not been initialized")."""


class PeerFailedError(ScaleoutError):
    """A collective failed because another rank or the transport failed. Horovod's name for it,
    HorovodInternalError, is an alias: the class elastic training recovers from."""


HorovodInternalError = PeerFailedError


class ShutDownError(PeerFailedError):
    """This rank or another rank shut down while the work was pending."""


class MismatchError(ScaleoutError):
    """Ranks disagree about a collective with the same name (shape, dtype, op, root, ...)."""


class DuplicateNameError(ScaleoutError, ValueError):
    """A collective with this name is already in flight on this rank (a ValueError, as
    Horovod's)."""


class TransportError(PeerFailedError):
    """The MPI (or another transport) failed."""


class DeadlockError(ScaleoutError):
    """Every rank waits for collectives that no rank can complete (a name that differs between
    ranks, a collective skipped on some ranks, blocking calls in different orders): raised on
    every rank, naming what each rank waits for. Catch it and go on: the runtime stays usable."""


class ScaleoutTimeoutError(ScaleoutError, TimeoutError):
    """A bounded wait ran out."""


class InternalError(ScaleoutError):
    """A broken invariant inside the core: please report it."""


class MPINotFoundError(ScaleoutError, ImportError):
    """No usable MPI library or mpi4py was found."""


class MPIMismatchError(ScaleoutError):
    """The MPI library, mpi4py and the launcher that started this process do not belong to one
    MPI (Note [No silent singletons]): raised by init() instead of running a job of one."""


BY_STATUS_NAME = {
    "INVALID_ARGUMENT": InvalidArgumentError,
    "NOT_INITIALIZED": NotInitializedError,
    "SHUT_DOWN": ShutDownError,
    "MISMATCH": MismatchError,
    "DUPLICATE_NAME": DuplicateNameError,
    "TRANSPORT": TransportError,
    "TIMEOUT": ScaleoutTimeoutError,
    "INTERNAL": InternalError,
    "UNKNOWN_HANDLE": InvalidArgumentError,
    "DEADLOCK": DeadlockError,
    "NOT_SUPPORTED": NotYetImplementedError,
}


def from_core(
    status_name: str, message: str, culprit_ranks: "tuple[int, ...]", process_set_id: Optional[int]
) -> ScaleoutError:
    """The exception for an error of the core (or of the binding's argument checks): the class
    registered for its status, with its message and Note [Error details]. The binding makes
    every exception it raises through this one function (scaleout._binding.register_errors)."""
    error = BY_STATUS_NAME.get(status_name, ScaleoutError)(message)
    error.culprit_ranks = tuple(culprit_ranks)
    error.process_set_id = process_set_id
    _rank_report.report_culprits(type(error).__name__, error.culprit_ranks)  # Note [Rank reports]
    return error
