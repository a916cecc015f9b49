"""scaleoutrun's command line and environment, parsed into one LaunchConfig.

Every flag has an environment variable. A flag on the command line wins over its variable;
the tuning flags use the SCALEOUT_* variables the core itself reads, so a value set in the
environment and one given as a flag mean the same thing.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

__all__ = ["LaunchConfig", "UsageError", "OPTIONS", "build_parser", "parse_config",
           "split_command", "tuning_environment"]

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


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        lowered = text.strip().lower()
        if lowered not in allowed:
            raise ValueError(f"{text!r} is not one of {', '.join(allowed)}")
        return lowered
    return parse


def _text(text: str) -> str:
    if not text:
        raise ValueError("empty value")
    return text


@dataclass(frozen=True)
class Option:
    """One flag: its spellings, the LaunchConfig field it fills, and its environment variable.

    env_parse reads the variable when it differs from the flag's own units (the fusion
    threshold is given in MiB on the command line and in bytes in SCALEOUT_FUSION_THRESHOLD).
    """
    flags: tuple[str, ...]
    field: str
    env: str
    help: str
    parse: Optional[Callable[[str], object]] = None   # None: a switch taking no value
    env_parse: Optional[Callable[[str], object]] = None
    metavar: Optional[str] = None

    @property
    def takes_value(self) -> bool:
        return self.parse is not None

    def parse_env(self, text: str) -> object:
        if not self.takes_value:
            return _boolean(text)
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
    Option(("--hostfile",), "hostfile", "SCALEOUTRUN_HOSTFILE",
           "file of 'host slots=N' lines ('#' starts a comment)", _text, metavar="FILE"),
    Option(("--slurm",), "slurm", "SCALEOUTRUN_SLURM",
           "inside a Slurm allocation: auto (without -H/--hostfile, run on the allocation's "
           "nodes, started through Slurm), on (start ranks through Slurm; an error outside an "
           "allocation), off (ignore Slurm: ssh to -H/--hostfile hosts, or this machine)",
           _choice(*SLURM_MODES), metavar="MODE"),
    Option(("--mpiexec",), "mpiexec", "SCALEOUT_MPIEXEC",
           "the MPI launcher to use (default: mpiexec beside this Python, then on PATH)",
           _text, metavar="PATH"),
    Option(("--mpi-yield",), "mpi_yield", "SCALEOUTRUN_MPI_YIELD",
           "make waiting ranks yield their core: auto (when there are more ranks than cores), "
           "on, off", _choice("auto", "on", "off"), metavar="MODE"),
    Option(("--ssh-port",), "ssh_port", "SCALEOUTRUN_SSH_PORT",
           "ssh port of the remote hosts", _positive_int, metavar="PORT"),
    Option(("--network-interface",), "network_interface", "SCALEOUTRUN_NETWORK_INTERFACE",
           "network interface for the launcher's and the MPI's traffic, e.g. eth0 "
           "(Hydra's -iface or Open MPI's tcp_if_include, and UCX_NET_DEVICES, FI_TCP_IFACE "
           "for an MPI over UCX or libfabric, unless set)",
           _text, metavar="IFACE"),
    Option(("--start-timeout",), "start_timeout", "SCALEOUTRUN_START_TIMEOUT",
           "seconds every rank may take to start before the launch is abandoned "
           "(default 60; 0: no limit)",
           _non_negative_float, metavar="S"),
    Option(("--check-build",), "check_build", "SCALEOUTRUN_CHECK_BUILD",
           "print the core's version, its MPI and the frameworks found, then exit"),
    Option(("-v", "--verbose"), "verbose", "SCALEOUTRUN_VERBOSE",
           "print the launcher command line before starting"),
    # Tuning: passed to every rank through the variables the core reads.
    Option(("--fusion-threshold-mb",), "fusion_threshold_bytes", "SCALEOUT_FUSION_THRESHOLD",
           "fusion buffer size in MiB (SCALEOUT_FUSION_THRESHOLD holds bytes)",
           _mebibytes_to_bytes, env_parse=_non_negative_int, metavar="MB"),
    Option(("--cycle-time-ms",), "cycle_time_ms", "SCALEOUT_CYCLE_TIME",
           "longest wait, in ms, to gather more work into one fused collective",
           _non_negative_float, metavar="MS"),
    Option(("--cache-capacity",), "cache_capacity", "SCALEOUT_CACHE_CAPACITY",
           "response cache entries (0 disables the cache)", _non_negative_int, metavar="N"),
    Option(("--stall-check-seconds",), "stall_check_seconds", "SCALEOUT_STALL_CHECK_TIME_SECONDS",
           "warn when a collective waits this long for other ranks",
           _non_negative_float, metavar="S"),
    Option(("--timeline",), "timeline", "SCALEOUT_TIMELINE",
           "write a Chrome trace of the collectives to FILE", _text, metavar="FILE"),
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
)

_BY_FLAG = {flag: option for option in OPTIONS for flag in option.flags}


@dataclass(frozen=True)
class LaunchConfig:
    """Everything scaleoutrun was asked to do; None means 'not given, use the default'."""
    command: tuple[str, ...] = ()
    np: Optional[int] = None
    hosts: Optional[str] = None
    hostfile: Optional[str] = None
    slurm: str = "auto"
    mpiexec: Optional[str] = None
    mpi_yield: str = "auto"
    ssh_port: Optional[int] = None
    network_interface: Optional[str] = None
    start_timeout: Optional[float] = None
    check_build: bool = False
    verbose: bool = False
    fusion_threshold_bytes: Optional[int] = None
    cycle_time_ms: Optional[float] = None
    cache_capacity: Optional[int] = None
    stall_check_seconds: Optional[float] = None
    timeline: Optional[str] = None
    bind_to: str = "auto"
    map_by: str = "socket"
    ep_servers: Optional[int] = None
    ep_affinity: Optional[str] = None
    threads_per_rank: Optional[int] = None
    print_placement: bool = False


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The parser of scaleoutrun's own flags (the command after them is split off first)."""
    parser = _Parser(
        prog="scaleoutrun", allow_abbrev=False,
        usage="scaleoutrun [options] [--] command [args...]",
        description="Start a data-parallel scaleout job: N ranks through the MPI's launcher.",
        epilog="Each flag can also be set through the environment variable shown after it.")
    for option in OPTIONS:
        help_text = f"{option.help} [{option.env}]"
        if option.takes_value:
            parser.add_argument(*option.flags, dest=option.field, metavar=option.metavar,
                                type=_argparse_type(option), default=None, help=help_text)
        else:
            parser.add_argument(*option.flags, dest=option.field, action="store_const",
                                const=True, default=None, help=help_text)
    return parser


def _argparse_type(option: Option) -> Callable[[str], object]:
    def convert(text: str) -> object:
        try:
            return option.parse(text)  # type: ignore[misc]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = option.field
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
            index += 1   # the flag's value, whatever it looks like
        index += 1
    return argv, []


def parse_config(argv: Sequence[str], environ: Mapping[str, str]) -> LaunchConfig:
    """Parses scaleoutrun's arguments; the environment fills what the command line leaves out.

    Raises UsageError (exit status 2) for a bad flag, a bad variable, a missing command or a
    number of ranks below 1.
    """
    ours, command = split_command(argv)
    namespace = build_parser().parse_args(ours)
    values: dict[str, object] = {}
    for option in OPTIONS:
        value = getattr(namespace, option.field)
        if value is None and environ.get(option.env, "") != "":
            try:
                value = option.parse_env(environ[option.env])
            except ValueError as exc:
                raise UsageError(f"environment variable {option.env}: {exc}") from None
        if value is not None:
            values[option.field] = value
    config = LaunchConfig(command=tuple(command), **values)  # type: ignore[arg-type]
    _validate(config)
    return config


def _validate(config: LaunchConfig) -> None:
    if config.hosts is not None and config.hostfile is not None:
        raise UsageError("give either -H/--hosts or --hostfile, not both")
    if not config.command and not (config.check_build or config.print_placement):
        raise UsageError("no command given: scaleoutrun -np N command [args...]")
    if config.ep_affinity is not None and config.ep_servers == 0:
        raise UsageError("--ep-affinity names endpoint cores but --ep-servers is 0")


def tuning_environment(config: LaunchConfig) -> dict[str, str]:
    """The SCALEOUT_* variables every rank gets from the tuning flags that were given."""
    values = {
        "SCALEOUT_FUSION_THRESHOLD": config.fusion_threshold_bytes,
        "SCALEOUT_CYCLE_TIME": config.cycle_time_ms,
        "SCALEOUT_CACHE_CAPACITY": config.cache_capacity,
        "SCALEOUT_STALL_CHECK_TIME_SECONDS": config.stall_check_seconds,
        "SCALEOUT_TIMELINE": config.timeline,
    }
    return {name: _format(value) for name, value in values.items() if value is not None}


def _format(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)

