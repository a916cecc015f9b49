"""scaleoutrun's command line, config file and environment, parsed into one LaunchConfig.

The flags are horovodrun's (Horovod 0.28.1) with horovodrun's meaning, plus scaleoutrun's own
(placement, Slurm, the MPI launcher). A horovodrun flag for something scaleout does not have is
refused by name (HOROVOD_ONLY), never silently ignored.

Every flag that does something has an environment variable. A flag on the command line wins
over a value in the --config-file (Horovod's YAML layout), which wins over the variable; the
tuning flags use the SCALEOUT_* variables the core itself reads, so a value set in the
environment and one given as a flag mean the same thing.
"""
from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence, Union

from .config_file import ConfigFileError, FILE_ONLY_KEYS, Setter, load_config_file

__all__ = ["LaunchConfig", "UsageError", "OPTIONS", "HOROVOD_ONLY", "LOG_LEVELS", "Option",
           "Refusal", "build_parser", "parse_config", "split_command", "tuning_environment"]

MIB = 1024 * 1024


class UsageError(Exception):
    """A request scaleoutrun cannot carry out as given: reported with exit status 2."""


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
    except ValueError as exc:   # an unclosed quote
        raise ValueError(f"{text!r} cannot be split into arguments: {exc}") from None


@dataclass(frozen=True)
class Option:
    """One flag: its spellings, the LaunchConfig field it fills, and its environment variable.

    env_parse reads the variable when it differs from the flag's own units (the fusion
    threshold is given in MiB on the command line and in bytes in SCALEOUT_FUSION_THRESHOLD).
    """
    flags: tuple[str, ...]
    field: Optional[str]      # None: accepted as horovodrun accepts it, and changes nothing here
    env: Optional[str]        # None only for --version (see its entry)
    help: str
    parse: Optional[Callable[[str], object]] = None   # None: a switch taking no value
    env_parse: Optional[Callable[[str], object]] = None
    metavar: Optional[Union[str, tuple[str, ...]]] = None
    off_flags: tuple[str, ...] = ()     # spellings that turn the switch off (--stall-check)
    repeatable: bool = False            # the flag may be given again; the lists add up
    env_aliases: tuple[str, ...] = ()   # older variable names, read when env is not set
    config_key: Optional[str] = None    # "section.key" in a Horovod --config-file
    nargs: int = 1                      # words the flag takes (--blacklist-cooldown-range: 2)

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
    Option(("-np", "-n", "--num-proc"), "np", "SCALEOUTRUN_NP",
           "number of ranks to start (default: the slots of -H/--hostfile)",
           _positive_int, metavar="N"),
    Option(("-H", "--hosts"), "hosts", "SCALEOUTRUN_HOSTS",
           "hosts and their slots, e.g. host1:2,host2:2", _text, metavar="LIST"),
    Option(("-hostfile", "--hostfile"), "hostfile", "SCALEOUTRUN_HOSTFILE",
           "file of 'host slots=N' lines ('#' starts a comment)", _text, metavar="FILE"),
    Option(("--slurm",), "slurm", "SCALEOUTRUN_SLURM",
           "inside a Slurm allocation: auto (without -H/--hostfile, run on the allocation's "
           "nodes, started through Slurm), on (start ranks through Slurm; an error outside an "
           "allocation), off (ignore Slurm: ssh to -H/--hostfile hosts, or this machine)",
           _choice(*SLURM_MODES), metavar="MODE"),
    Option(("--mpiexec",), "mpiexec", "SCALEOUT_MPIEXEC",
           "the MPI launcher to use (default: mpiexec beside this Python, then on PATH)",
           _text, metavar="PATH"),
    Option(("--mpi-args",), "mpi_args", "SCALEOUTRUN_MPI_ARGS",
           "extra arguments for the MPI launcher, split as a shell would, placed before the "
           "rank command, e.g. --mpi-args=\"-genv FOO 1\" (Hydra) or \"--mca btl ^openib\" "
           "(Open MPI)", _words, metavar="ARGS"),
    Option(("--mpi-yield",), "mpi_yield", "SCALEOUTRUN_MPI_YIELD",
           "make waiting ranks yield their core: auto (when there are more ranks than cores), "
           "on, off", _choice("auto", "on", "off"), metavar="MODE"),
    Option(("-p", "--ssh-port"), "ssh_port", "SCALEOUTRUN_SSH_PORT",
           "ssh port of the remote hosts", _positive_int, metavar="PORT"),
    Option(("-i", "--ssh-identity-file"), "ssh_identity_file", "SCALEOUTRUN_SSH_IDENTITY_FILE",
           "private key, on this machine, that ssh uses to reach the remote hosts (given to the "
           "MPI launcher's ssh and to scaleoutrun's own check of unreachable hosts)",
           _text, metavar="FILE"),
    Option(("--network-interfaces", "--network-interface"), "network_interfaces",
           "SCALEOUTRUN_NETWORK_INTERFACES",
           "network interfaces for the launcher's and the MPI's traffic, comma-separated, e.g. "
           "eth0,eth1 (either spelling, may be repeated). Open MPI gets them all "
           "(btl_tcp_if_include, oob_tcp_if_include), as does UCX (UCX_NET_DEVICES); Hydra's "
           "-iface and libfabric's FI_TCP_IFACE take one, the first. Variables you set stay",
           _interfaces, metavar="LIST", repeatable=True,
           env_aliases=("SCALEOUTRUN_NETWORK_INTERFACE",)),
    Option(("--start-timeout",), "start_timeout", "SCALEOUTRUN_START_TIMEOUT",
           "seconds every rank may take to start before the launch is abandoned "
           "(default 60; 0: no limit)",
           _non_negative_float, metavar="S"),
    Option(("--output-filename",), "output_filename", "SCALEOUTRUN_OUTPUT_FILENAME",
           "also write each rank's stdout and stderr to DIR/1/rank.N/stdout and "
           "DIR/1/rank.N/stderr (Open MPI's layout, as horovodrun gets from mpirun; N padded "
           "with zeros to sort; a relative DIR is taken from this directory, and each rank "
           "writes its files on its own host). The lines still reach the terminal",
           _text, metavar="DIR"),
    Option(("--prefix-output-with-timestamp", "-prefix-timestamp"),
           "prefix_output_with_timestamp", "SCALEOUTRUN_PREFIX_OUTPUT_WITH_TIMESTAMP",
           "start each output line with the local time as horovodrun does, before the rank: "
           "'Tue Jun 13 10:00:00 2023[1] text'"),
    Option(("--config-file",), "config_file", "SCALEOUTRUN_CONFIG_FILE",
           "YAML file of settings in horovodrun's layout (params, timeline, stall_check, "
           "logging, ...); a flag on the command line wins over the file",
           _text, metavar="FILE"),
    Option(("-cb", "--check-build"), "check_build", "SCALEOUTRUN_CHECK_BUILD",
           "print the core's version, its MPI and the frameworks found, then exit"),
    # No variable: one named SCALEOUTRUN_VERSION is as likely to hold a version string, and a
    # variable that made every scaleoutrun exit without running its job would be a trap.
    Option(("-v", "--version"), "version", None, "print scaleout's version and exit"),
    Option(("--verbose",), "verbose", "SCALEOUTRUN_VERBOSE",
           "print the launcher command line before starting"),
    # Tuning: passed to every rank through the variables the core reads.
    Option(("--fusion-threshold-mb",), "fusion_threshold_bytes", "SCALEOUT_FUSION_THRESHOLD",
           "fusion buffer size in MiB; 0 disables fusion (SCALEOUT_FUSION_THRESHOLD holds bytes)",
           _mebibytes_to_bytes, env_parse=_non_negative_int, metavar="MB",
           config_key="params.fusion_threshold_mb"),
    Option(("--cycle-time-ms",), "cycle_time_ms", "SCALEOUT_CYCLE_TIME",
           "longest wait, in ms, to gather more work into one fused collective",
           _non_negative_float, metavar="MS", config_key="params.cycle_time_ms"),
    Option(("--cache-capacity",), "cache_capacity", "SCALEOUT_CACHE_CAPACITY",
           "response cache entries (0 disables the cache)", _non_negative_int, metavar="N",
           config_key="params.cache_capacity"),
    Option(("--stall-check-warning-time-seconds", "--stall-check-seconds"),
           "stall_check_seconds", "SCALEOUT_STALL_CHECK_TIME_SECONDS",
           "warn when a collective waits this long for other ranks",
           _non_negative_float, metavar="S", config_key="stall_check.warning_time_seconds"),
    Option(("--stall-check-shutdown-time-seconds",), "stall_shutdown_seconds",
           "SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS",
           "shut the job down when a collective waits this long for other ranks (only when "
           "more than the warning time; 0: never)",
           _non_negative_float, metavar="S", config_key="stall_check.shutdown_time_seconds"),
    Option(("--no-stall-check",), "stall_check_disable", "SCALEOUT_STALL_CHECK_DISABLE",
           "turn the stall check off (--stall-check turns it back on)",
           off_flags=("--stall-check",)),
    Option(("--hierarchical-allreduce",), "hierarchical_allreduce",
           "SCALEOUT_HIERARCHICAL_ALLREDUCE",
           "across machines, reduce inside each machine through shared memory and between "
           "machines over MPI (the default whenever a machine has more than one rank: every "
           "rank crosses with its slice where machines have the same number of ranks, each "
           "machine's first rank otherwise; --no-hierarchical-allreduce: flat MPI)",
           off_flags=("--no-hierarchical-allreduce",), env_parse=_auto_or_boolean,
           config_key="params.hierarchical_allreduce"),
    Option(("--hierarchical-allgather",), "hierarchical_allgather",
           "SCALEOUT_HIERARCHICAL_ALLGATHER",
           "across machines, gather inside each machine and send each machine's part once to "
           "each other machine (the default whenever a machine has more than one rank; "
           "--no-hierarchical-allgather: flat MPI)",
           off_flags=("--no-hierarchical-allgather",), env_parse=_auto_or_boolean,
           config_key="params.hierarchical_allgather"),
    Option(("--timeline-filename", "--timeline"), "timeline", "SCALEOUT_TIMELINE",
           "write a Chrome trace of the collectives to FILE", _text, metavar="FILE",
           config_key="timeline.filename"),
    Option(("--timeline-mark-cycles",), "timeline_mark_cycles", "SCALEOUT_TIMELINE_MARK_CYCLES",
           "mark the core's cycles in the timeline (only with --timeline-filename)",
           off_flags=("--no-timeline-mark-cycles",), config_key="timeline.mark_cycles"),
    Option(("--stats",), "stats", "SCALEOUT_STATS",
           "at shutdown each rank prints one line: per collective kind, calls, bytes submitted, "
           "written to shared memory and handed to MPI, time reducing and waiting",
           off_flags=("--no-stats",)),
    Option(("--log-level",), "log_level", "SCALEOUT_LOG_LEVEL",
           f"the core's log level: {', '.join(LOG_LEVELS)} (any case)",
           _log_level, env_parse=_log_level_variable, metavar="LEVEL",
           config_key="logging.level"),
    # Elastic training (launcher/elastic.py), with horovodrun's meanings.
    Option(("--host-discovery-script",), "host_discovery_script",
           "SCALEOUTRUN_HOST_DISCOVERY_SCRIPT",
           "run an elastic job: a command (run by the shell, every second) printing the hosts "
           "that can run ranks now, one per line, as 'host' or 'host:slots'. The job fails at "
           "once if its first run fails; later failures are retried. Not with -H/--hostfile",
           _text, metavar="SCRIPT"),
    Option(("--min-np", "--min-num-proc"), "min_np", "SCALEOUTRUN_MIN_NP",
           "elastic: the fewest ranks the job runs with; below it, it waits for hosts "
           "(default: -np). Given with -H/--hostfile instead of a discovery script, those "
           "hosts (at least two) are the job's",
           _positive_int, metavar="N"),
    Option(("--max-np", "--max-num-proc"), "max_np", "SCALEOUTRUN_MAX_NP",
           "elastic: the most ranks the job runs with (default: every slot discovered)",
           _positive_int, metavar="N"),
    Option(("--slots-per-host", "--slots"), "slots_per_host", "SCALEOUTRUN_SLOTS_PER_HOST",
           "elastic: slots of a discovered host whose line gives none (default 1)",
           _positive_int, metavar="K"),
    Option(("--elastic-timeout",), "elastic_timeout", "SCALEOUTRUN_ELASTIC_TIMEOUT",
           "elastic: seconds to wait for --min-np slots (-np at the start) before the job "
           "fails (default 600)", _non_negative_float, metavar="S",
           env_aliases=("HOROVOD_ELASTIC_TIMEOUT",)),
    Option(("--reset-limit",), "reset_limit", "SCALEOUTRUN_RESET_LIMIT",
           "elastic: how many times the job may restart at a new size (after a failure or a "
           "change of hosts) before it fails (default: no limit)",
           _non_negative_int, metavar="N"),
    Option(("--blacklist-cooldown-range",), "blacklist_cooldown",
           "SCALEOUTRUN_BLACKLIST_COOLDOWN_RANGE",
           "elastic: a host where a rank failed is left out for MIN * 2**failures seconds "
           "plus up to MIN more, within [MIN, MAX] (1 <= MIN <= MAX <= 3600); without it, for "
           "good. The variable holds both numbers, e.g. '60 300'",
           _positive_int, env_parse=_int_pair, metavar=("MIN", "MAX"),
           nargs=2),
    # Placement (launcher/placement.py).
    Option(("--bind-to",), "bind_to", "SCALEOUTRUN_BIND_TO",
           "bind each rank to: auto (its domain's cores when ranks fit, else none), none, "
           "core, socket, numa", _choice(*BIND_TO), metavar="WHAT"),
    Option(("--map-by",), "map_by", "SCALEOUTRUN_MAP_BY",
           "spread the ranks of a node over: socket, numa, core (fill cores in order)",
           _choice(*MAP_BY), metavar="WHAT"),
    Option(("--ep-servers",), "ep_servers", "SCALEOUTRUN_EP_SERVERS",
           "communication (endpoint-server) cores per rank, taken from the end of its domain "
           "(default: 1 when the rank has 4 or more cores, else 0)",
           _non_negative_int, metavar="K"),
    Option(("--ep-affinity",), "ep_affinity", "SCALEOUTRUN_EP_AFFINITY",
           "explicit endpoint-server cores, e.g. 16,17,34,35 (K per rank, in local-rank order)",
           _text, metavar="LIST"),
    Option(("--threads-per-rank",), "threads_per_rank", "SCALEOUTRUN_THREADS_PER_RANK",
           "compute threads per rank (default: its compute cores)", _positive_int, metavar="T"),
    Option(("--print-placement",), "print_placement", "SCALEOUTRUN_PRINT_PLACEMENT",
           "print the placement plan as a table and exit without launching"),
    # horovodrun flags that ask for what scaleoutrun already does: accepted, no effect.
    Option(("--mpi",), None, "SCALEOUTRUN_MPI",
           "horovodrun's MPI controller: scaleout always runs over MPI"),
    Option(("--disable-cache",), None, "SCALEOUTRUN_DISABLE_CACHE",
           "horovodrun's: redo the start-up checks rather than trust an hour-old result; "
           "scaleoutrun never caches them (the response cache is --cache-capacity 0)"),
    Option(("--no-autotune",), None, "SCALEOUTRUN_NO_AUTOTUNE",
           "horovodrun's: no autotuning, as here (there is none yet)"),
    Option(("--no-mpi-threads-disable",), None, "SCALEOUTRUN_NO_MPI_THREADS_DISABLE",
           "horovodrun's: keep MPI's thread support, as the core always does"),
    Option(("--log-without-timestamp", "--log-hide-timestamp"), None,
           "SCALEOUTRUN_LOG_WITHOUT_TIMESTAMP",
           "horovodrun's: no timestamp in the core's log lines, as always here"),
)


@dataclass(frozen=True)
class Refusal:
    """horovodrun flags for something scaleout does not do (yet): a usage error naming them."""
    flags: tuple[str, ...]
    why: str


_AUTOTUNE = ("autotuning is not available in scaleout yet: set --fusion-threshold-mb and "
             "--cycle-time-ms yourself")
_NO_GPU = "scaleout has no GPU (NCCL) support yet"
_NO_GLOO = "scaleout has no Gloo controller: it always runs over MPI (drop the flag)"
_LOG_TIME = ("the core's log lines carry no timestamp; --prefix-output-with-timestamp "
             "timestamps every output line instead")

# Together with OPTIONS, every flag of horovodrun 0.28.1 (horovod/runner/launch.py); checked
# against that list by tests/test_launcher_horovod_flags.py.
HOROVOD_ONLY: tuple[Refusal, ...] = (
    Refusal(("--gloo",), _NO_GLOO),
    Refusal(("--gloo-timeout-seconds",), _NO_GLOO),
    Refusal(("--jsrun",), "scaleoutrun does not start ranks through LSF's jsrun: inside an LSF "
                          "allocation give its hosts with -H or --hostfile"),
    Refusal(("--autotune", "--autotune-log-file", "--autotune-warmup-samples",
             "--autotune-steps-per-sample", "--autotune-bayes-opt-max-samples",
             "--autotune-gaussian-process-noise"), _AUTOTUNE),
    Refusal(("--num-nccl-streams",), _NO_GPU),
    Refusal(("--tcp",), "it makes NCCL and Spectrum MPI use TCP, neither of which scaleout "
                        "uses; to choose the MPI's interfaces use --network-interfaces, or pass "
                        "the MPI's own settings with --mpi-args"),
    Refusal(("--binding-args",), "scaleoutrun binds each rank itself: use --bind-to and "
                                 "--map-by (and --mpi-args for other launcher arguments)"),
    Refusal(("--thread-affinity",), "the core's coordinator thread is not pinned on its own; "
                                    "--ep-affinity pins the endpoint-server threads"),
    Refusal(("--mpi-threads-disable",), "the core's coordinator thread needs "
                                        "MPI_THREAD_MULTIPLE, so MPI's thread support stays on"),
    Refusal(("--log-with-timestamp", "--no-log-hide-timestamp"), _LOG_TIME),
)

_BY_FLAG = {flag: option for option in OPTIONS for flag in option.spellings}
_REFUSED = {flag: refusal for refusal in HOROVOD_ONLY for flag in refusal.flags}


@dataclass(frozen=True)
class LaunchConfig:
    """Everything scaleoutrun was asked to do; None means 'not given, use the default'."""
    command: tuple[str, ...] = ()
    np: Optional[int] = None
    hosts: Optional[str] = None
    hostfile: Optional[str] = None
    slurm: str = "auto"
    mpiexec: Optional[str] = None
    mpi_args: tuple[str, ...] = ()
    mpi_yield: str = "auto"
    ssh_port: Optional[int] = None
    ssh_identity_file: Optional[str] = None
    network_interfaces: tuple[str, ...] = ()
    start_timeout: Optional[float] = None
    output_filename: Optional[str] = None
    prefix_output_with_timestamp: bool = False
    config_file: Optional[str] = None
    check_build: bool = False
    version: bool = False
    verbose: bool = False
    fusion_threshold_bytes: Optional[int] = None
    cycle_time_ms: Optional[float] = None
    cache_capacity: Optional[int] = None
    stall_check_seconds: Optional[float] = None
    stall_shutdown_seconds: Optional[float] = None
    stall_check_disable: Optional[bool] = None
    hierarchical_allreduce: Optional[bool] = None
    hierarchical_allgather: Optional[bool] = None
    timeline: Optional[str] = None
    timeline_mark_cycles: Optional[bool] = None
    stats: Optional[bool] = None
    log_level: Optional[str] = None
    bind_to: str = "auto"
    map_by: str = "socket"
    ep_servers: Optional[int] = None
    ep_affinity: Optional[str] = None
    threads_per_rank: Optional[int] = None
    print_placement: bool = False
    host_discovery_script: Optional[str] = None
    min_np: Optional[int] = None
    max_np: Optional[int] = None
    slots_per_host: Optional[int] = None
    elastic_timeout: Optional[float] = None
    reset_limit: Optional[int] = None
    blacklist_cooldown: Optional[tuple[int, int]] = None

    @property
    def elastic(self) -> bool:
        """An elastic job, as horovodrun decides: a discovery script or a minimum size."""
        return self.host_discovery_script is not None or self.min_np is not None


# Flags that only mean something in an elastic job.
ELASTIC_ONLY = ("max_np", "slots_per_host", "elastic_timeout", "reset_limit", "blacklist_cooldown")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The parser of scaleoutrun's own flags (the command after them is split off first)."""
    refused = "; ".join(", ".join(refusal.flags) for refusal in HOROVOD_ONLY)
    parser = _Parser(
        prog="scaleoutrun", allow_abbrev=False,
        usage="scaleoutrun [options] [--] command [args...]",
        description="Start a data-parallel scaleout job: N ranks through the MPI's launcher. "
                    "horovodrun's flags work with horovodrun's meaning.",
        epilog="Each flag can also be set through the environment variable shown after it. "
               f"horovodrun flags for features scaleout does not have are refused: {refused}.")
    for option in OPTIONS:
        dest = option.field or "_ignored"
        help_text = f"{option.help} [{option.env}]" if option.env else option.help
        if option.takes_value:
            parser.add_argument(*option.flags, dest=dest, metavar=option.metavar,
                                action="append" if option.repeatable else "store",
                                nargs=None if option.nargs == 1 else option.nargs,
                                type=_argparse_type(option), default=None, help=help_text)
        else:
            parser.add_argument(*option.flags, dest=dest, action="store_const",
                                const=True, default=None, help=help_text)
            if option.off_flags:
                parser.add_argument(*option.off_flags, dest=dest, action="store_const",
                                    const=False, default=None, help=argparse.SUPPRESS)
    return parser


def _argparse_type(option: Option) -> Callable[[str], object]:
    def convert(text: str) -> object:
        try:
            return option.parse(text)  # type: ignore[misc]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = option.field or option.flags[0]
    return convert


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Splits argv into scaleoutrun's own arguments and the command to run on every rank.

    The command starts at the first word that is neither a flag of ours nor a flag's value
    (or after a '--'), so the command's own flags are never taken for ours:
    `scaleoutrun -np 2 python train.py -np 5` runs train.py with `-np 5`. Unknown flags
    before the command stay on our side, where the parser reports them.
    """
    argv = list(argv)
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "--":
            return argv[:index], argv[index + 1:]
        if not word.startswith("-") or word == "-":
            return argv[:index], argv[index:]
        option = _BY_FLAG.get(word.split("=", 1)[0])
        if option is not None and option.takes_value and "=" not in word:
            index += option.nargs   # the flag's values, whatever they look like
        index += 1
    return argv, []


def _check_horovod_spellings(ours: Sequence[str]) -> None:
    """Names a refused horovodrun flag, and an abbreviated one (horovodrun's argparse takes
    unique prefixes; scaleoutrun cannot, since it must know where the command starts)."""
    index = 0
    while index < len(ours):
        name = ours[index].split("=", 1)[0]
        refusal = _REFUSED.get(name)
        if refusal is not None:
            raise UsageError(f"{name} (horovodrun) is not supported: {refusal.why}")
        option = _BY_FLAG.get(name)
        if option is None and name.startswith("--") and len(name) > 2:
            meant = [flag for flag in (*_BY_FLAG, *_REFUSED) if flag.startswith(name)]
            if meant:
                raise UsageError(f"{name}: scaleoutrun takes flags only in full (horovodrun "
                                 f"also takes a prefix): did you mean {' or '.join(meant)}?")
        index += 1 + option.nargs if option is not None and option.takes_value \
            and "=" not in ours[index] else 1


def _config_file_setters() -> dict[str, Setter]:
    """For each key of the config file that fills one option: how its value becomes fields."""
    setters: dict[str, Setter] = {}
    for option in OPTIONS:
        if option.config_key is not None:
            setters[option.config_key] = _setter(option)
    return setters


def _setter(option: Option) -> Setter:
    def convert(value: object) -> dict[str, object]:
        if not option.takes_value:
            if not isinstance(value, bool):
                raise ValueError(f"{value!r} is not true or false")
            return {option.field: value}   # type: ignore[dict-item]
        if isinstance(value, (bool, list, dict)) or value is None:
            raise ValueError(f"{value!r} is not a {option.metavar or 'value'}")
        return {option.field: option.parse(str(value))}   # type: ignore[misc,dict-item]
    return convert


def parse_config(argv: Sequence[str], environ: Mapping[str, str],
                 read_text: Optional[Callable[[str], str]] = None) -> LaunchConfig:
    """Parses scaleoutrun's arguments; a --config-file, then the environment, fill what the
    command line leaves out. read_text(path) reads the config file (default: from disk).

    Raises UsageError (exit status 2) for a bad or refused flag, a bad variable or config file
    entry, a missing command or a number of ranks below 1.
    """
    ours, command = split_command(argv)
    _check_horovod_spellings(ours)
    namespace = build_parser().parse_args(ours)
    given: dict[str, object] = {}
    for option in OPTIONS:
        if option.field is None:
            continue
        value = getattr(namespace, option.field)
        if value is not None and option.repeatable:
            value = _merged(value)
        elif value is not None and option.nargs > 1:
            value = tuple(value)
        if value is not None:
            given[option.field] = value
    from_env: dict[str, object] = {}
    for option in OPTIONS:
        names = ((option.env,) if option.env else ()) + option.env_aliases
        name = next((name for name in names if environ.get(name, "") != ""), None)
        if name is None:
            continue
        try:
            value = option.parse_env(environ[name])
        except ValueError as exc:
            raise UsageError(f"environment variable {name}: {exc}") from None
        if option.field is not None:
            from_env[option.field] = value
    config_file = given.get("config_file", from_env.get("config_file"))
    from_file: dict[str, object] = {}
    if config_file is not None:
        from_file = _read_config_file(str(config_file), read_text or _read_from_disk)
    values = {**from_env, **from_file, **given}
    config = LaunchConfig(command=tuple(command), **values)  # type: ignore[arg-type]
    _validate(config)
    if not config.elastic:
        # A variable such as HOROVOD_ELASTIC_TIMEOUT may be set for every job; a flag is not.
        stray = [option.flags[0] for option in OPTIONS
                 if option.field in ELASTIC_ONLY and option.field in given]
        if stray:
            raise UsageError(f"{', '.join(stray)} only applies to an elastic job: give "
                             "--host-discovery-script (or --min-np with -H/--hostfile)")
    return config


def _merged(lists: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item for values in lists for item in values))


def _read_from_disk(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _read_config_file(path: str, read_text: Callable[[str], str]) -> dict[str, object]:
    try:
        text = read_text(path)
    except OSError as exc:
        raise UsageError(f"cannot read the config file {path}: "
                         f"{exc.strerror or exc}") from None
    try:
        return load_config_file(text, {**_config_file_setters(), **FILE_ONLY_KEYS})
    except ConfigFileError as exc:
        raise UsageError(f"config file {path}: {exc}") from None


def _validate(config: LaunchConfig) -> None:
    if config.hosts is not None and config.hostfile is not None:
        raise UsageError("give either -H/--hosts or --hostfile, not both")
    if not config.command and not (config.check_build or config.print_placement
                                   or config.version):
        raise UsageError("no command given: scaleoutrun -np N command [args...]")
    if config.ep_affinity is not None and config.ep_servers == 0:
        raise UsageError("--ep-affinity names endpoint cores but --ep-servers is 0")
    if config.host_discovery_script is not None and (config.hosts or config.hostfile):
        raise UsageError("give either --host-discovery-script or -H/--hostfile, not both")
    if config.elastic and config.print_placement:
        raise UsageError("--print-placement shows a job of fixed hosts: an elastic job's hosts "
                         "are known only as each generation starts")
    if config.elastic:
        lowest = config.min_np if config.min_np is not None else config.np
        if config.np is not None and lowest is not None and lowest > config.np:
            raise UsageError(f"--min-np {lowest} is more than -np {config.np}")
        if config.max_np is not None and lowest is not None and config.max_np < lowest:
            raise UsageError(f"--max-np {config.max_np} is less than "
                             f"{'--min-np' if config.min_np is not None else '-np'} {lowest}")
        if config.blacklist_cooldown is not None:
            low, high = config.blacklist_cooldown
            if not 1 <= low <= high <= 3600:
                raise UsageError(f"--blacklist-cooldown-range {low} {high}: the range must "
                                 "have 1 <= MIN <= MAX <= 3600 (seconds)")
    if config.ssh_identity_file is not None and len(config.ssh_identity_file.split()) != 1:
        # Hydra and Open MPI both split their extra ssh arguments on white space.
        raise UsageError(f"--ssh-identity-file {config.ssh_identity_file!r}: the MPI "
                         "launchers cannot pass a path containing white space to ssh; use a "
                         "path (or a link) without it")


def tuning_environment(config: LaunchConfig) -> dict[str, str]:
    """The SCALEOUT_* variables every rank gets from the tuning flags that were given."""
    values = {
        "SCALEOUT_FUSION_THRESHOLD": config.fusion_threshold_bytes,
        "SCALEOUT_CYCLE_TIME": config.cycle_time_ms,
        "SCALEOUT_CACHE_CAPACITY": config.cache_capacity,
        "SCALEOUT_STALL_CHECK_TIME_SECONDS": config.stall_check_seconds,
        "SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS": config.stall_shutdown_seconds,
        "SCALEOUT_STALL_CHECK_DISABLE": config.stall_check_disable,
        "SCALEOUT_HIERARCHICAL_ALLREDUCE": config.hierarchical_allreduce,
        "SCALEOUT_HIERARCHICAL_ALLGATHER": config.hierarchical_allgather,
        "SCALEOUT_TIMELINE": config.timeline,
        # As horovodrun: cycle marks only mean something in a timeline.
        "SCALEOUT_TIMELINE_MARK_CYCLES": config.timeline_mark_cycles if config.timeline else None,
        "SCALEOUT_STATS": config.stats,
        "SCALEOUT_LOG_LEVEL": config.log_level,
    }
    return {name: _format(value) for name, value in values.items() if value is not None}


def _format(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
