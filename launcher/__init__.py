"""scaleoutrun, the launcher, as stages (main.py runs them in this order):

    config      the arguments, config file and environment -> LaunchConfig (options: the table
                of flags and horovodrun's refused ones; config_file: Horovod's YAML)
    plan        LaunchConfig -> JobPlan: hosts (hosts, slurm), placement (topology, placement,
                placement_table); pure
    command     JobPlan -> the MPI launcher's command line (mpi_launcher) with each rank's
                wrapper command, and its environment
    supervisor  runs it: relays its output (relay), stops the job at the first failure, cleans
                up the process tree and the MPI segments (shm_cleanup)
    report      what is said at the end, and the exit status: the rank that failed first in
                cause (blame), unreachable hosts (unreachable), ranks that never started
    elastic_driver  an elastic job, generation after generation of the above (elastic_plan: its
                decisions, pure; elastic_discovery: the hosts; elastic_notifier: the channel
                to rank 0)

Each rank runs under the rank wrapper (rank_exec, with rank_env, output and exit_report: the
lines it reports on), which scaleoutrun starts by path, outside the scaleout package.

Imports: the rank wrapper and the modules it imports (rank_exec, exit_report, output,
placement, topology, rank_env, slurm, hosts, errors, shm_cleanup) import nothing from scaleout,
so that starting a rank never loads MPI, which belongs to the user's program. The other modules
import from scaleout only its pure modules, which load neither MPI nor the native core:
scaleout._elastic_protocol (what the elastic driver and the ranks agree on), scaleout._rank_report
(the records a rank's errors send scaleoutrun), scaleout._commit_store (an elastic job's
commits on disk) and scaleout._mpi_library (which MPI the ranks will load, asked of a
subprocess). check_build loads the core, in its function, only when asked to.
tests/test_launcher_layers.py checks both rules.

Installed as the package scaleout.launcher.
"""

__all__: list[str] = []
