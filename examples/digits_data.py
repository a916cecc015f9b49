"""The digits the PyTorch examples train on: scikit-learn's copy of the UCI handwritten digits
(1,797 8x8 images, values 0-16, and their labels 0-9), read from the installed scikit-learn
package without importing it, and a stratified train/test split made with numpy.

Importing scikit-learn costs a process about 2 s of CPU on a small VM (it imports SciPy),
which every rank of every (re)started generation of an elastic job would pay for one 57 KB file.
"""

import importlib.util
import os

import numpy as np


def load() -> tuple[np.ndarray, np.ndarray]:
    """(images as float64 of shape (1797, 8, 8) with values 0-16, labels as int64)."""
    spec = importlib.util.find_spec("sklearn")  # finds the package; imports nothing
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the digits examples read their data from scikit-learn: pip install scikit-learn"
        )
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    table = np.loadtxt(path, delimiter=",")  # 64 pixels, then the label, per row
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)


def split(labels: np.ndarray, test_fraction: float = 0.25, seed: int = 0):
    """(train indices, test indices): each label's share of the test set as in the whole (the
    leftover places go to the labels with the largest remainders), picked at random with seed."""
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    n_test = int(np.ceil(test_fraction * len(labels)))
    exact = counts * n_test / len(labels)
    per_class = np.floor(exact).astype(int)
    per_class[np.argsort(per_class - exact)[: n_test - per_class.sum()]] += 1
    train, test = [], []
    for c, k in zip(classes, per_class):
        members = rng.permutation(np.flatnonzero(labels == c))
        test.append(members[:k])
        train.append(members[k:])
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))
