"""scaleoutrun's flags, as one table: OPTIONS (each flag's spellings, the LaunchConfig field it
fills, its environment variable, its help and how its value is read) and HOROVOD_ONLY (the
horovodrun flags scaleoutrun refuses, each saying why). config.py parses with them; the
configuration page of the documentation is generated from them.

The flags are horovodrun's (Horovod 0.28.1) with horovodrun's meaning, plus scaleoutrun's own
(placement, Slurm, the MPI launcher). A horovodrun flag for something scaleout does not have is
refused by name (HOROVOD_ONLY), never silently ignored. Every flag that does something has an
environment variable; the tuning flags use the SCALEOUT_* variables the core itself reads, so a
value set in the environment and one given as a flag mean the same thing.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Callable, Optional, Union

__all__ = [
    "Option",
    "OPTIONS",
    "Refusal",
    "HOROVOD_ONLY",
    "LOG_LEVELS",
    "SLURM_MODES",
    "BIND_TO",
    "MAP_BY",
]

MIB = 1024 * 1024


# Values parsed from text, by the command line and by the environment alike.
def _positive_int(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"{value} is not a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None
    if value < 0:
        raise ValueError(f"{value} is negative")
    return value


def _sample_count(text: str) -> int:
    value = _positive_int(text)
    if value > 100:  # the core's kAutotuneMaxSamples
        raise ValueError(f"{value} is more than 100")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{text!r} is not a finite non-negative number")
    return value


def _mebibytes_to_bytes(text: str) -> int:
    return int(round(_non_negative_float(text) * MIB))


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{text!r} is not a boolean (use 1 or 0)")


def _auto_or_boolean(text: str) -> Optional[bool]:
    """A switch whose variable may also say auto (None: the core decides)."""
    return None if text.strip().lower() == "auto" else _boolean(text)


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        lowered = text.strip().lower()
        if lowered not in allowed:
            raise ValueError(f"{text!r} is not one of {', '.join(allowed)}")
        return lowered

    return parse


def _int_pair(text: str) -> tuple[int, int]:
    words = text.split()
    if len(words) != 2:
        raise ValueError(f"{text!r} is not two numbers (MIN MAX)")
    first, second = (_positive_int(word) for word in words)
    return first, second


def _text(text: str) -> str:
    if not text:
        raise ValueError("empty value")
    return text


def _interfaces(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(","))
    if not all(names) or any(len(name.split()) != 1 for name in names):
        raise ValueError(f"{text!r} is not a comma-separated list of interface names")
    return names


# Horovod's level names, most verbose first (HOROVOD_LOG_LEVEL's values).
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")


def _log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"{text!r} is not one of {', '.join(LOG_LEVELS)}")
    return level


def _log_level_variable(text: str) -> str:
    # SCALEOUT_LOG_LEVEL set by hand may still hold the core's older numeric level: it reaches
    # the core unchanged.
    return text.strip() if text.strip().isdigit() else _log_level(text)


def _words(text: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:  # an unclosed quote
        raise ValueError(f"{text!r} cannot be split into arguments: {exc}") from None


@dataclass(frozen=True)
class Option:
    """One flag: its spellings, the LaunchConfig field it fills, and its environment variable.

    env_parse reads the variable when it differs from the flag's own units (the fusion
    threshold is given in MiB on the command line and in bytes in SCALEOUT_FUSION_THRESHOLD).
    """

    flags: tuple[str, ...]
    field: Optional[str]  # None: accepted as horovodrun accepts it, and changes nothing here
    env: Optional[str]  # None only for --version (see its entry)
    help: str
    parse: Optional[Callable[[str], object]] = None  # None: a switch taking no value
    env_parse: Optional[Callable[[str], object]] = None
    metavar: Optional[Union[str, tuple[str, ...]]] = None
    off_flags: tuple[str, ...] = ()  # spellings that turn the switch off (--stall-check)
    repeatable: bool = False  # the flag may be given again; the lists add up
    env_aliases: tuple[str, ...] = ()  # older variable names, read when env is not set
    config_key: Optional[str] = None  # "section.key" in a Horovod --config-file
    nargs: int = 1  # words the flag takes (--blacklist-cooldown-range: 2)

    @property
    def takes_value(self) -> bool:
        return self.parse is not None

    @property
    def spellings(self) -> tuple[str, ...]:
        return self.flags + self.off_flags

    def parse_env(self, text: str) -> object:
        if not self.takes_value:
            return (self.env_parse or _boolean)(text)
        return (self.env_parse or self.parse)(text)


SLURM_MODES = ("auto", "on", "off")
BIND_TO = ("auto", "none", "core", "socket", "numa")
MAP_BY = ("socket", "numa", "core")

OPTIONS: tuple[Option, ...] = (
    Option(
        ("-np", "-n", "--num-proc"),
        "np",
        "SCALEOUTRUN_NP",
        "number of ranks to start (default: the slots of -H/--hostfile)",
        _positive_int,
        metavar="N",
    ),
    Option(
        ("-H", "--hosts"),
        "hosts",
        "SCALEOUTRUN_HOSTS",
        "hosts and their slots, e.g. host1:2,host2:2",
        _text,
        metavar="LIST",
    ),
    Option(
        ("-hostfile", "--hostfile"),
        "hostfile",
        "SCALEOUTRUN_HOSTFILE",
        "file of 'host slots=N' lines ('#' starts a comment)",
        _text,
        metavar="FILE",
    ),
    Option(
        ("--slurm",),
        "slurm",
        "SCALEOUTRUN_SLURM",
        "inside a Slurm allocation: auto (without -H/--hostfile, run on the allocation's "
        "nodes, started through Slurm), on (start ranks through Slurm; an error outside an "
        "allocation), off (ignore Slurm: ssh to -H/--hostfile hosts, or this machine)",
        _choice(*SLURM_MODES),
        metavar="MODE",
    ),
    Option(
        ("--mpiexec",),
        "mpiexec",
        "SCALEOUT_MPIEXEC",
        "the MPI launcher to use, checked against the MPI the ranks load (default: that MPI's "
        "own, from its installation's bin/, beside the ranks' Python, or on PATH)",
        _text,
        metavar="PATH",
    ),
    Option(
        ("--mpi-args",),
        "mpi_args",
        "SCALEOUTRUN_MPI_ARGS",
        "extra arguments for the MPI launcher, split as a shell would, placed before the "
        'rank command, e.g. --mpi-args="-genv FOO 1" (Hydra) or "--mca btl ^openib" '
        "(Open MPI)",
        _words,
        metavar="ARGS",
    ),
    Option(
        ("--mpi-yield",),
        "mpi_yield",
        "SCALEOUTRUN_MPI_YIELD",
        "make waiting ranks yield their core: auto (when there are more ranks than cores), on, off",
        _choice("auto", "on", "off"),
        metavar="MODE",
    ),
    Option(
        ("-p", "--ssh-port"),
        "ssh_port",
        "SCALEOUTRUN_SSH_PORT",
        "ssh port of the remote hosts",
        _positive_int,
        metavar="PORT",
    ),
    Option(
        ("-i", "--ssh-identity-file"),
        "ssh_identity_file",
        "SCALEOUTRUN_SSH_IDENTITY_FILE",
        "private key, on this machine, that ssh uses to reach the remote hosts (given to the "
        "MPI launcher's ssh and to scaleoutrun's own check of unreachable hosts)",
        _text,
        metavar="FILE",
    ),
    Option(
        ("--network-interfaces", "--network-interface"),
        "network_interfaces",
        "SCALEOUTRUN_NETWORK_INTERFACES",
        "network interfaces for the launcher's and the MPI's traffic, comma-separated, e.g. "
        "eth0,eth1 (either spelling, may be repeated). Open MPI gets them all "
        "(btl_tcp_if_include, oob_tcp_if_include), as does UCX (UCX_NET_DEVICES); Hydra's "
        "-iface and libfabric's FI_TCP_IFACE take one, the first. Variables you set stay",
        _interfaces,
        metavar="LIST",
        repeatable=True,
        env_aliases=("SCALEOUTRUN_NETWORK_INTERFACE",),
    ),
    Option(
        ("--start-timeout",),
        "start_timeout",
        "SCALEOUTRUN_START_TIMEOUT",
        "seconds every rank may take to start before the launch is abandoned "
        "(default 60; 0: no limit)",
        _non_negative_float,
        metavar="S",
    ),
    Option(
        ("--output-filename",),
        "output_filename",
        "SCALEOUTRUN_OUTPUT_FILENAME",
        "also write each rank's stdout and stderr to DIR/1/rank.N/stdout and "
        "DIR/1/rank.N/stderr (Open MPI's layout, as horovodrun gets from mpirun; N padded "
        "with zeros to sort; a relative DIR is taken from this directory, and each rank "
        "writes its files on its own host). The lines still reach the terminal",
        _text,
        metavar="DIR",
    ),
    Option(
        ("--prefix-output-with-timestamp", "-prefix-timestamp"),
        "prefix_output_with_timestamp",
        "SCALEOUTRUN_PREFIX_OUTPUT_WITH_TIMESTAMP",
        "start each output line with the local time as horovodrun does, before the rank: "
        "'Tue Jun 13 10:00:00 2023[1] text'",
    ),
    Option(
        ("--config-file",),
        "config_file",
        "SCALEOUTRUN_CONFIG_FILE",
        "YAML file of settings in horovodrun's layout (params, timeline, stall_check, "
        "logging, ...); a flag on the command line wins over the file",
        _text,
        metavar="FILE",
    ),
    Option(
        ("-cb", "--check-build"),
        "check_build",
        "SCALEOUTRUN_CHECK_BUILD",
        "print the core's version, its MPI and the frameworks found, then exit",
    ),
    # No variable: one named SCALEOUTRUN_VERSION is as likely to hold a version string, and a
    # variable that made every scaleoutrun exit without running its job would be a trap.
    Option(("-v", "--version"), "version", None, "print scaleout's version and exit"),
    Option(
        ("--verbose",),
        "verbose",
        "SCALEOUTRUN_VERBOSE",
        "print the launcher command line before starting",
    ),
    # Tuning: passed to every rank through the variables the core reads.
    Option(
        ("--fusion-threshold-mb",),
        "fusion_threshold_bytes",
        "SCALEOUT_FUSION_THRESHOLD",
        "fusion buffer size in MiB; 0 disables fusion (SCALEOUT_FUSION_THRESHOLD holds bytes)",
        _mebibytes_to_bytes,
        env_parse=_non_negative_int,
        metavar="MB",
        config_key="params.fusion_threshold_mb",
    ),
    Option(
        ("--cycle-time-ms",),
        "cycle_time_ms",
        "SCALEOUT_CYCLE_TIME",
        "longest wait, in ms, to gather more work into one fused collective",
        _non_negative_float,
        metavar="MS",
        config_key="params.cycle_time_ms",
    ),
    Option(
        ("--autotune",),
        "autotune",
        "SCALEOUT_AUTOTUNE",
        "rank 0 tunes the fusion threshold and cycle time during the first steps, then keeps the "
        "best and prints it (docs/autotune.md); a value given with --fusion-threshold-mb or "
        "--cycle-time-ms is not tuned",
        off_flags=("--no-autotune",),
        config_key="autotune.enabled",
    ),
    Option(
        ("--autotune-log-file",),
        "autotune_log",
        "SCALEOUT_AUTOTUNE_LOG",
        "with --autotune: rank 0 writes a CSV row per sample to FILE (Horovod's columns)",
        _text,
        metavar="FILE",
        config_key="autotune.log_file",
    ),
    Option(
        ("--autotune-warmup-samples",),
        "autotune_warmup_samples",
        "SCALEOUT_AUTOTUNE_WARMUP_SAMPLES",
        "with --autotune: samples to let pass before scoring (default 3)",
        _non_negative_int,
        metavar="N",
        config_key="autotune.warmup_samples",
    ),
    Option(
        ("--autotune-steps-per-sample",),
        "autotune_steps_per_sample",
        "SCALEOUT_AUTOTUNE_STEPS_PER_SAMPLE",
        "with --autotune: training steps in one sample (default 10)",
        _positive_int,
        metavar="N",
        config_key="autotune.steps_per_sample",
    ),
    Option(
        ("--autotune-bayes-opt-max-samples",),
        "autotune_bayes_opt_max_samples",
        "SCALEOUT_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
        "with --autotune: samples scored before the best is kept (default 16, at most 100)",
        _sample_count,
        metavar="N",
        config_key="autotune.bayes_opt_max_samples",
    ),
    Option(
        ("--autotune-gaussian-process-noise",),
        "autotune_gaussian_process_noise",
        "SCALEOUT_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
        "with --autotune: the noise the search assumes in a score, relative to the scores' "
        "spread (default 0.8)",
        _non_negative_float,
        metavar="NOISE",
        config_key="autotune.gaussian_process_noise",
    ),
    Option(
        ("--cache-capacity",),
        "cache_capacity",
        "SCALEOUT_CACHE_CAPACITY",
        "response cache entries (0 disables the cache)",
        _non_negative_int,
        metavar="N",
        config_key="params.cache_capacity",
    ),
    Option(
        ("--stall-check-warning-time-seconds", "--stall-check-seconds"),
        "stall_check_seconds",
        "SCALEOUT_STALL_CHECK_TIME_SECONDS",
        "warn when a collective waits this long for other ranks",
        _non_negative_float,
        metavar="S",
        config_key="stall_check.warning_time_seconds",
    ),
    Option(
        ("--stall-check-shutdown-time-seconds",),
        "stall_shutdown_seconds",
        "SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS",
        "shut the job down when a collective waits this long for other ranks (only when "
        "more than the warning time; 0: never)",
        _non_negative_float,
        metavar="S",
        config_key="stall_check.shutdown_time_seconds",
    ),
    Option(
        ("--no-stall-check",),
        "stall_check_disable",
        "SCALEOUT_STALL_CHECK_DISABLE",
        "turn the stall check off (--stall-check turns it back on)",
        off_flags=("--stall-check",),
    ),
    Option(
        ("--hierarchical-allreduce",),
        "hierarchical_allreduce",
        "SCALEOUT_HIERARCHICAL_ALLREDUCE",
        "across machines, reduce inside each machine through shared memory and between "
        "machines over MPI (the default whenever a machine has more than one rank: every "
        "rank crosses with its slice where machines have the same number of ranks, each "
        "machine's first rank otherwise; --no-hierarchical-allreduce: flat MPI)",
        off_flags=("--no-hierarchical-allreduce",),
        env_parse=_auto_or_boolean,
        config_key="params.hierarchical_allreduce",
    ),
    Option(
        ("--hierarchical-allgather",),
        "hierarchical_allgather",
        "SCALEOUT_HIERARCHICAL_ALLGATHER",
        "across machines, gather inside each machine and send each machine's part once to "
        "each other machine (the default whenever a machine has more than one rank; "
        "--no-hierarchical-allgather: flat MPI)",
        off_flags=("--no-hierarchical-allgather",),
        env_parse=_auto_or_boolean,
        config_key="params.hierarchical_allgather",
    ),
    Option(
        ("--timeline-filename", "--timeline"),
        "timeline",
        "SCALEOUT_TIMELINE",
        "write a Chrome trace of the collectives to FILE",
        _text,
        metavar="FILE",
        config_key="timeline.filename",
    ),
    Option(
        ("--timeline-mark-cycles",),
        "timeline_mark_cycles",
        "SCALEOUT_TIMELINE_MARK_CYCLES",
        "mark the core's cycles in the timeline (only with --timeline-filename)",
        off_flags=("--no-timeline-mark-cycles",),
        config_key="timeline.mark_cycles",
    ),
    Option(
        ("--stats",),
        "stats",
        "SCALEOUT_STATS",
        "at shutdown each rank prints one line: per collective kind, calls, bytes submitted, "
        "written to shared memory and handed to MPI, time reducing and waiting",
        off_flags=("--no-stats",),
    ),
    Option(
        ("--log-level",),
        "log_level",
        "SCALEOUT_LOG_LEVEL",
        f"the core's log level: {', '.join(LOG_LEVELS)} (any case)",
        _log_level,
        env_parse=_log_level_variable,
        metavar="LEVEL",
        config_key="logging.level",
    ),
    # Elastic training (launcher/elastic_*.py), with horovodrun's meanings.
    Option(
        ("--host-discovery-script",),
        "host_discovery_script",
        "SCALEOUTRUN_HOST_DISCOVERY_SCRIPT",
        "run an elastic job: a command (run by the shell, every second) printing the hosts "
        "that can run ranks now, one per line, as 'host' or 'host:slots'. The job fails at "
        "once if its first run fails; later failures are retried. Not with -H/--hostfile",
        _text,
        metavar="SCRIPT",
    ),
    Option(
        ("--min-np", "--min-num-proc"),
        "min_np",
        "SCALEOUTRUN_MIN_NP",
        "elastic: the fewest ranks the job runs with; below it, it waits for hosts "
        "(default: -np). Given with -H/--hostfile instead of a discovery script, those "
        "hosts (at least two) are the job's",
        _positive_int,
        metavar="N",
    ),
    Option(
        ("--max-np", "--max-num-proc"),
        "max_np",
        "SCALEOUTRUN_MAX_NP",
        "elastic: the most ranks the job runs with (default: every slot discovered)",
        _positive_int,
        metavar="N",
    ),
    Option(
        ("--slots-per-host", "--slots"),
        "slots_per_host",
        "SCALEOUTRUN_SLOTS_PER_HOST",
        "elastic: slots of a discovered host whose line gives none (default 1)",
        _positive_int,
        metavar="K",
    ),
    Option(
        ("--elastic-timeout",),
        "elastic_timeout",
        "SCALEOUTRUN_ELASTIC_TIMEOUT",
        "elastic: seconds to wait for --min-np slots (-np at the start) before the job "
        "fails (default 600)",
        _non_negative_float,
        metavar="S",
        env_aliases=("HOROVOD_ELASTIC_TIMEOUT",),
    ),
    Option(
        ("--reset-limit",),
        "reset_limit",
        "SCALEOUTRUN_RESET_LIMIT",
        "elastic: how many times the job may restart at a new size (after a failure or a "
        "change of hosts) before it fails (default: no limit)",
        _non_negative_int,
        metavar="N",
    ),
    Option(
        ("--blacklist-cooldown-range",),
        "blacklist_cooldown",
        "SCALEOUTRUN_BLACKLIST_COOLDOWN_RANGE",
        "elastic: a host where a rank failed is left out for MIN * 2**failures seconds "
        "plus up to MIN more, within [MIN, MAX] (1 <= MIN <= MAX <= 3600); without it, for "
        "good. The variable holds both numbers, e.g. '60 300'",
        _positive_int,
        env_parse=_int_pair,
        metavar=("MIN", "MAX"),
        nargs=2,
    ),
    # Placement (launcher/placement.py).
    Option(
        ("--bind-to",),
        "bind_to",
        "SCALEOUTRUN_BIND_TO",
        "bind each rank to: auto (its domain's cores when ranks fit, else none), none, "
        "core, socket, numa",
        _choice(*BIND_TO),
        metavar="WHAT",
    ),
    Option(
        ("--map-by",),
        "map_by",
        "SCALEOUTRUN_MAP_BY",
        "spread the ranks of a node over: socket, numa, core (fill cores in order)",
        _choice(*MAP_BY),
        metavar="WHAT",
    ),
    Option(
        ("--ep-servers",),
        "ep_servers",
        "SCALEOUTRUN_EP_SERVERS",
        "communication (endpoint-server) cores per rank, taken from the end of its domain "
        "(default: 1 when the rank has 4 or more cores, else 0)",
        _non_negative_int,
        metavar="K",
    ),
    Option(
        ("--ep-affinity",),
        "ep_affinity",
        "SCALEOUTRUN_EP_AFFINITY",
        "explicit endpoint-server cores, e.g. 16,17,34,35 (K per rank, in local-rank order)",
        _text,
        metavar="LIST",
    ),
    Option(
        ("--threads-per-rank",),
        "threads_per_rank",
        "SCALEOUTRUN_THREADS_PER_RANK",
        "compute threads per rank (default: its compute cores)",
        _positive_int,
        metavar="T",
    ),
    Option(
        ("--print-placement",),
        "print_placement",
        "SCALEOUTRUN_PRINT_PLACEMENT",
        "print the placement plan as a table and exit without launching",
    ),
    # horovodrun flags that ask for what scaleoutrun already does: accepted, no effect.
    Option(
        ("--mpi",),
        None,
        "SCALEOUTRUN_MPI",
        "horovodrun's MPI controller: scaleout always runs over MPI",
    ),
    Option(
        ("--disable-cache",),
        None,
        "SCALEOUTRUN_DISABLE_CACHE",
        "horovodrun's: redo the start-up checks rather than trust an hour-old result; "
        "scaleoutrun never caches them (the response cache is --cache-capacity 0)",
    ),
    Option(
        ("--no-mpi-threads-disable",),
        None,
        "SCALEOUTRUN_NO_MPI_THREADS_DISABLE",
        "horovodrun's: keep MPI's thread support, as the core always does",
    ),
    Option(
        ("--log-without-timestamp", "--log-hide-timestamp"),
        None,
        "SCALEOUTRUN_LOG_WITHOUT_TIMESTAMP",
        "horovodrun's: no timestamp in the core's log lines, as always here",
    ),
)


@dataclass(frozen=True)
class Refusal:
    """horovodrun flags for something scaleout does not do (yet): a usage error naming them."""

    flags: tuple[str, ...]
    why: str


_NO_GPU = "scaleout has no GPU (NCCL) support yet"
_NO_GLOO = "scaleout has no Gloo controller: it always runs over MPI (drop the flag)"
_LOG_TIME = (
    "the core's log lines carry no timestamp; --prefix-output-with-timestamp "
    "timestamps every output line instead"
)

# Together with OPTIONS, every flag of horovodrun 0.28.1 (horovod/runner/launch.py); checked
# against that list by tests/test_launcher_horovod.py.
HOROVOD_ONLY: tuple[Refusal, ...] = (
    Refusal(("--gloo",), _NO_GLOO),
    Refusal(("--gloo-timeout-seconds",), _NO_GLOO),
    Refusal(
        ("--jsrun",),
        "scaleoutrun does not start ranks through LSF's jsrun: inside an LSF "
        "allocation give its hosts with -H or --hostfile",
    ),
    Refusal(("--num-nccl-streams",), _NO_GPU),
    Refusal(
        ("--tcp",),
        "it makes NCCL and Spectrum MPI use TCP, neither of which scaleout "
        "uses; to choose the MPI's interfaces use --network-interfaces, or pass "
        "the MPI's own settings with --mpi-args",
    ),
    Refusal(
        ("--binding-args",),
        "scaleoutrun binds each rank itself: use --bind-to and "
        "--map-by (and --mpi-args for other launcher arguments)",
    ),
    Refusal(
        ("--thread-affinity",),
        "set SCALEOUT_THREAD_AFFINITY (one CPU per local rank) for "
        "the core to pin its coordinator thread; --ep-affinity pins "
        "the endpoint-server threads",
    ),
    Refusal(
        ("--mpi-threads-disable",),
        "the core's coordinator thread needs MPI_THREAD_MULTIPLE, so MPI's thread support stays on",
    ),
    Refusal(("--log-with-timestamp", "--no-log-hide-timestamp"), _LOG_TIME),
)
