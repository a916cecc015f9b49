"""scaleoutrun, the launcher: parse arguments (config), plan hosts and placement (hosts, plan,
topology, placement), start the ranks through the MPI's own launcher (mpi_launcher, job), and
wrap each rank (rank_exec).

Installed as the package scaleout.launcher. Its modules import nothing from scaleout outside
this package except in check_build, so the rank wrapper can run without loading MPI.
"""
__all__: list[str] = []
