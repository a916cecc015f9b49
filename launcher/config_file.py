"""horovodrun's --config-file: a YAML file of runtime settings, in Horovod 0.28.1's layout.

    controller: mpi
    params:          {fusion_threshold_mb: 64, cycle_time_ms: 1, cache_capacity: 1024,
                      hierarchical_allreduce: false, hierarchical_allgather: false}
    autotune:        {enabled: false, log_file: ..., warmup_samples: 3, steps_per_sample: 10,
                      bayes_opt_max_samples: 20, gaussian_process_noise: 0.8}
    timeline:        {filename: timeline.json, mark_cycles: false}
    stall_check:     {enabled: true, warning_time_seconds: 60, shutdown_time_seconds: 0}
    library_options: {mpi_threads_disable: false, num_nccl_streams: 1, thread_affinity: 0,
                      gloo_timeout_seconds: 30}
    logging:         {level: WARNING, with_timestamp: false}

Keys that fill one scaleoutrun option are given by the caller (config.py marks them on the
options themselves); the others are here: those whose meaning is not one option's, and those
naming what scaleout does not have, accepted only when they ask for it to stay off. Unlike
horovodrun, which skips keys it does not know, an unknown key is an error naming it: a
misspelt setting should not vanish silently.
"""

from __future__ import annotations

from typing import Callable, Mapping

__all__ = ["ConfigFileError", "Setter", "FILE_ONLY_KEYS", "SECTIONS", "load_config_file"]

# A key's value -> the LaunchConfig fields it sets; ValueError (the reason) for a bad value.
Setter = Callable[[object], "dict[str, object]"]

SECTIONS = ("params", "autotune", "timeline", "stall_check", "library_options", "logging")


class ConfigFileError(ValueError):
    """A config file scaleoutrun cannot use; the message names the key."""


def _switch(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not true or false")
    return value


def _controller(value: object) -> dict[str, object]:
    if not isinstance(value, str) or value.lower() not in ("mpi", "gloo"):
        raise ValueError(f"{value!r} is not a controller (mpi or gloo)")
    if value.lower() == "gloo":
        raise ValueError(
            "scaleout has no Gloo controller: it always runs over MPI "
            "(use 'mpi' or leave the key out)"
        )
    return {}


def _only_off(what: str) -> Setter:
    """A switch for a feature scaleout lacks: false is what happens anyway, true an error."""

    def check(value: object) -> dict[str, object]:
        if _switch(value):
            raise ValueError(f"{what}; only false is accepted")
        return {}

    return check


def _refused(what: str) -> Setter:
    def refuse(value: object) -> dict[str, object]:
        raise ValueError(what)

    return refuse


def _stall_check_enabled(value: object) -> dict[str, object]:
    return {"stall_check_disable": not _switch(value)}


FILE_ONLY_KEYS: dict[str, Setter] = {
    "controller": _controller,
    "stall_check.enabled": _stall_check_enabled,
    "library_options.mpi_threads_disable": _only_off(
        "the core's coordinator thread needs MPI_THREAD_MULTIPLE"
    ),
    "library_options.num_nccl_streams": _refused("scaleout has no GPU (NCCL) support yet"),
    "library_options.thread_affinity": _refused(
        "set SCALEOUT_THREAD_AFFINITY (one CPU per local rank) for the core to pin its "
        "coordinator thread; --ep-affinity pins the endpoint-server threads"
    ),
    "library_options.gloo_timeout_seconds": _refused("scaleout has no Gloo controller"),
    "logging.with_timestamp": _only_off(
        "the core's log lines carry no timestamp "
        "(--prefix-output-with-timestamp timestamps every "
        "output line instead)"
    ),
}


def load_config_file(text: str, setters: Mapping[str, Setter]) -> dict[str, object]:
    """The LaunchConfig fields a config file sets. setters: "section.key" (or a top-level key)
    -> its Setter. Raises ConfigFileError naming the key for anything it cannot use."""
    try:
        import yaml  # noqa: PLC0415  (only needed with --config-file)
    except ImportError:
        raise ConfigFileError("reading it needs PyYAML (pip install pyyaml)") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"not valid YAML: {exc}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigFileError(
            "expected a mapping of sections (params:, timeline:, ...) at the top level"
        )
    fields: dict[str, object] = {}
    for name, body in document.items():
        if name in setters:
            fields.update(_apply(str(name), body, setters))
            continue
        if name not in SECTIONS:
            known = ", ".join(sorted({key.split(".")[0] for key in setters}))
            raise ConfigFileError(f"unknown key {name!r} (known: {known})")
        if body is None:  # an empty section, as horovodrun allows
            continue
        if not isinstance(body, dict):
            raise ConfigFileError(f"{name}: expected a mapping of keys, got {body!r}")
        for key, value in body.items():
            dotted = f"{name}.{key}"
            if dotted not in setters:
                known = ", ".join(
                    sorted(k.split(".", 1)[1] for k in setters if k.startswith(name + "."))
                )
                raise ConfigFileError(f"unknown key {dotted!r} (known in {name}: {known})")
            fields.update(_apply(dotted, value, setters))
    return fields


def _apply(key: str, value: object, setters: Mapping[str, Setter]) -> dict[str, object]:
    try:
        return setters[key](value)
    except ValueError as exc:
        raise ConfigFileError(f"{key}: {exc}") from None
