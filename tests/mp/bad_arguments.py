"""Run by
tests/test_errors_and_lifecycle.py::test_bad_arguments_are_invalid_argument_errors_in_every_front_end.

Bad arguments to every front end's collectives are InvalidArgumentErrors (also ValueErrors) on
the rank that passed them, raised before anything is submitted, so the job goes on: no value is
silently converted (a float or string root rank, float or string splits, a string scale factor),
no name is cut short (an embedded NUL) or unencodable, no non-handle is polled."""

import numpy as np
import torch
from _harness import check, check_close, expect_error, main_tests
from tf_common import tf  # noqa: F401  (TensorFlow set up quietly first)

import scaleout as so
import scaleout.tensorflow as hvd_tf
import scaleout.torch as hvd_torch

BAD_ROOTS = [0.9, "0", 2**31, 2**32 + 1, -(2**40), None]


def expect_invalid(fn, *fragments, what):
    msg = expect_error(so.InvalidArgumentError, fn, *fragments, what=what)
    try:
        fn()
    except ValueError:
        pass
    except Exception as e:  # noqa: BLE001
        check(False, f"{what}: {type(e).__name__} is not a ValueError")
    return msg


def test_root_rank_must_be_an_integer_rank(r, n):
    fronts = {
        "numpy": lambda root: so.broadcast(np.ones(2), root),
        "numpy in place": lambda root: so.broadcast_(np.ones(2), root),
        "torch": lambda root: hvd_torch.broadcast(torch.ones(2), root),
        "torch in place": lambda root: hvd_torch.broadcast_(torch.ones(2), root),
        "tensorflow": lambda root: hvd_tf.broadcast(tf.ones(2), root),
    }
    for front, call in fronts.items():
        for root in BAD_ROOTS:
            expect_invalid(lambda: call(root), "root", what=f"{front}: root_rank={root!r}")
        check_close(call(np.int64(n - 1)), [1.0, 1.0], f"{front}: a numpy integer root works")


def test_splits_must_be_integers(r, n):
    for front, call in {
        "numpy": lambda s: so.alltoall(np.ones(n), splits=s),
        "torch": lambda s: hvd_torch.alltoall(torch.ones(n), splits=s),
        "tensorflow": lambda s: hvd_tf.alltoall(tf.ones(n), splits=s),
    }.items():
        expect_invalid(
            lambda: call(np.ones(n)), "splits", "integers", what=f"{front}: float splits"
        )
        expect_invalid(lambda: call("1" * n), "splits", what=f"{front}: string splits")
        out, received = call(np.ones(n, np.int32))
        check(np.asarray(received).tolist() == [1] * n, f"{front}: int32 splits work")


def test_names_stay_distinct(r, n):
    for front, call in {
        "numpy": lambda name: so.allreduce(np.ones(2), name=name),
        "torch": lambda name: hvd_torch.allreduce(torch.ones(2), name=name),
        "tensorflow": lambda name: hvd_tf.allreduce(tf.ones(2), name=name),
    }.items():
        # rank 0's "grad\0a" and rank 1's "grad\0b" must not meet as one collective "grad"
        expect_invalid(lambda: call(f"grad\0{r}"), "NUL", what=f"{front}: a NUL in a name")
        expect_invalid(lambda: call("grad\ud800"), "UTF-8", what=f"{front}: a lone surrogate")
        expect_invalid(lambda: call(""), "name", what=f"{front}: an empty name")
        check_close(call("grad.ok"), [1.0, 1.0], f"{front}: the job goes on")


def test_other_arguments(r, n):
    expect_invalid(
        lambda: so.allreduce(np.ones(2), prescale_factor="2"),
        "prescale_factor",
        what="a string scale factor",
    )
    expect_invalid(
        lambda: hvd_torch.allreduce(torch.ones(2), postscale_factor="2"),
        "postscale_factor",
        what="torch: a string scale factor",
    )
    expect_invalid(lambda: so.poll(5), "Handle", what="poll of a non-handle")
    expect_invalid(lambda: so.synchronize("x"), "Handle", what="synchronize of a non-handle")
    expect_invalid(lambda: hvd_torch.synchronize(3), "Handle", what="torch synchronize")
    expect_invalid(lambda: so.allreduce(np.ones((1,) * 33)), "dimensions", what="ndim 33")
    check_close(so.allreduce(np.ones(2), op=so.Sum), [n, n], "still working")


if __name__ == "__main__":
    main_tests(globals())
