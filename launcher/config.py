"""scaleoutrun's command line, config file and environment, parsed into one LaunchConfig, by the
table of flags in options.py.

A flag on the command line wins over a value in the --config-file (Horovod's YAML layout), which
wins over the flag's environment variable.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from .config_file import FILE_ONLY_KEYS, ConfigFileError, Setter, load_config_file
from .errors import UsageError
from .options import HOROVOD_ONLY, OPTIONS, Option

__all__ = ["LaunchConfig", "build_parser", "parse_config", "split_command"]

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
    autotune: Optional[bool] = None
    autotune_log: Optional[str] = None
    autotune_warmup_samples: Optional[int] = None
    autotune_steps_per_sample: Optional[int] = None
    autotune_bayes_opt_max_samples: Optional[int] = None
    autotune_gaussian_process_noise: Optional[float] = None
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
        prog="scaleoutrun",
        allow_abbrev=False,
        usage="scaleoutrun [options] [--] command [args...]",
        description="Start a data-parallel scaleout job: N ranks through the MPI's launcher. "
        "horovodrun's flags work with horovodrun's meaning.",
        epilog="Each flag can also be set through the environment variable shown after it. "
        f"horovodrun flags for features scaleout does not have are refused: {refused}.",
    )
    for option in OPTIONS:
        dest = option.field or "_ignored"
        help_text = f"{option.help} [{option.env}]" if option.env else option.help
        if option.takes_value:
            parser.add_argument(
                *option.flags,
                dest=dest,
                metavar=option.metavar,
                action="append" if option.repeatable else "store",
                nargs=None if option.nargs == 1 else option.nargs,
                type=_argparse_type(option),
                default=None,
                help=help_text,
            )
        else:
            parser.add_argument(
                *option.flags,
                dest=dest,
                action="store_const",
                const=True,
                default=None,
                help=help_text,
            )
            if option.off_flags:
                parser.add_argument(
                    *option.off_flags,
                    dest=dest,
                    action="store_const",
                    const=False,
                    default=None,
                    help=argparse.SUPPRESS,
                )
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
            return argv[:index], argv[index + 1 :]
        if not word.startswith("-") or word == "-":
            return argv[:index], argv[index:]
        option = _BY_FLAG.get(word.split("=", 1)[0])
        if option is not None and option.takes_value and "=" not in word:
            index += option.nargs  # the flag's values, whatever they look like
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
                raise UsageError(
                    f"{name}: scaleoutrun takes flags only in full (horovodrun "
                    f"also takes a prefix): did you mean {' or '.join(meant)}?"
                )
        index += (
            1 + option.nargs
            if option is not None and option.takes_value and "=" not in ours[index]
            else 1
        )


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
            return {option.field: value}  # type: ignore[dict-item]
        if isinstance(value, (bool, list, dict)) or value is None:
            raise ValueError(f"{value!r} is not a {option.metavar or 'value'}")
        return {option.field: option.parse(str(value))}  # type: ignore[misc,dict-item]

    return convert


def parse_config(
    argv: Sequence[str],
    environ: Mapping[str, str],
    read_text: Optional[Callable[[str], str]] = None,
) -> LaunchConfig:
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
        stray = [
            option.flags[0]
            for option in OPTIONS
            if option.field in ELASTIC_ONLY and option.field in given
        ]
        if stray:
            raise UsageError(
                f"{', '.join(stray)} only applies to an elastic job: give "
                "--host-discovery-script (or --min-np with -H/--hostfile)"
            )
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
        raise UsageError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    try:
        return load_config_file(text, {**_config_file_setters(), **FILE_ONLY_KEYS})
    except ConfigFileError as exc:
        raise UsageError(f"config file {path}: {exc}") from None


def _validate(config: LaunchConfig) -> None:
    if config.hosts is not None and config.hostfile is not None:
        raise UsageError("give either -H/--hosts or --hostfile, not both")
    if not config.command and not (config.check_build or config.print_placement or config.version):
        raise UsageError("no command given: scaleoutrun -np N command [args...]")
    if config.ep_affinity is not None and config.ep_servers == 0:
        raise UsageError("--ep-affinity names endpoint cores but --ep-servers is 0")
    if config.host_discovery_script is not None and (config.hosts or config.hostfile):
        raise UsageError("give either --host-discovery-script or -H/--hostfile, not both")
    if config.elastic and config.print_placement:
        raise UsageError(
            "--print-placement shows a job of fixed hosts: an elastic job's hosts "
            "are known only as each generation starts"
        )
    if config.elastic:
        lowest = config.min_np if config.min_np is not None else config.np
        if config.np is not None and lowest is not None and lowest > config.np:
            raise UsageError(f"--min-np {lowest} is more than -np {config.np}")
        if config.max_np is not None and lowest is not None and config.max_np < lowest:
            raise UsageError(
                f"--max-np {config.max_np} is less than "
                f"{'--min-np' if config.min_np is not None else '-np'} {lowest}"
            )
        if config.blacklist_cooldown is not None:
            low, high = config.blacklist_cooldown
            if not 1 <= low <= high <= 3600:
                raise UsageError(
                    f"--blacklist-cooldown-range {low} {high}: the range must "
                    "have 1 <= MIN <= MAX <= 3600 (seconds)"
                )
    if config.ssh_identity_file is not None and len(config.ssh_identity_file.split()) != 1:
        # Hydra and Open MPI both split their extra ssh arguments on white space.
        raise UsageError(
            f"--ssh-identity-file {config.ssh_identity_file!r}: the MPI "
            "launchers cannot pass a path containing white space to ssh; use a "
            "path (or a link) without it"
        )
