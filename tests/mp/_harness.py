"""Helpers for scripts that run on every rank: named checks that report which rank failed."""

from __future__ import annotations

import sys
import traceback

import numpy as np

import scaleout as so
from scaleout import _native

# Before MPI_Init, as scaleout does when it imports mpi4py itself (Note [Intel MPI and dead peers],
# Note [Open MPI under srun]).
_native.set_mpi_environment()

from mpi4py import MPI  # noqa: E402

RANK = MPI.COMM_WORLD.rank  # usable before init and after shutdown

failures = []


def check(cond: bool, what: str) -> None:
    if not cond:
        failures.append(what)
        print(f"rank {RANK}: FAILED: {what}", file=sys.stderr, flush=True)


def check_close(got, want, what: str, rtol=1e-6, atol=1e-6) -> None:
    got, want = np.asarray(got), np.asarray(want)
    ok = got.shape == want.shape and np.allclose(
        got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol
    )
    check(
        ok,
        f"{what}: got {got.ravel()[:8]} shape {got.shape}, "
        f"want {want.ravel()[:8]} shape {want.shape}",
    )


def expect_error(exc_type, fn, *fragments: str, what: str = "") -> str:
    try:
        fn()
    except exc_type as e:
        msg = str(e)
        for f in fragments:
            check(f in msg, f"{what}: message {msg!r} lacks {f!r}")
        return msg
    except Exception as e:  # noqa: BLE001
        check(False, f"{what}: raised {type(e).__name__}: {e}, want {exc_type.__name__}")
        return ""
    check(False, f"{what}: raised nothing, want {exc_type.__name__}")
    return ""


def finish() -> None:
    if failures:
        print(f"rank {RANK}: {len(failures)} checks failed", file=sys.stderr, flush=True)
        sys.stdout.flush()
        sys.exit(1)
    print(f"rank {RANK}: all checks passed", flush=True)


def main(fn, **init_args) -> None:
    """Inits (with `init_args`), runs fn, and reports this rank's checks."""
    so.init(**init_args)
    try:
        fn()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        failures.append("exception")
    finish()


def main_tests(namespace: dict) -> None:
    """Inits, then runs every test_*(rank, size) function of a script's namespace in order."""

    def run():
        r, n = so.rank(), so.size()
        for name, fn in list(namespace.items()):
            if name.startswith("test_"):
                fn(r, n)

    main(run)
