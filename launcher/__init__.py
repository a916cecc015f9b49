"""scaleoutrun, the launcher: parse arguments (config), plan hosts and placement (hosts, slurm,
plan, topology, placement), start the ranks through the MPI's own launcher over ssh or Slurm
(mpi_launcher, job, unreachable), and wrap each rank (rank_exec).

Installed as the package scaleout.launcher. Its modules import nothing from scaleout outside
this package except in check_build, so the rank wrapper can run without loading MPI.
"""
__all__: list[str] = []
