"""A Slurm allocation, read from the variables Slurm sets in a batch script or salloc shell.

    SLURM_JOB_NODELIST=node[01-03,07]   the allocated nodes, in Slurm's compressed syntax
    SLURM_TASKS_PER_NODE=2(x3),1        tasks per node, run-length encoded
    SLURM_NTASKS=7                      the tasks asked for (the default number of ranks)

Pure functions over a mapping of variables.

Note [Inside an srun step]
~~~~~~~~~~~~~~~~~~~~~~~~~~
srun gives the tasks of a step its own SLURM_NTASKS and SLURM_TASKS_PER_NODE (the step's, not
the allocation's: `srun -n 1` in a 4-task allocation says 1), beside the job's SLURM_JOB_NODELIST.
So a scaleoutrun started by srun cannot read the allocation: it would run too few ranks, or
refuse the disagreement; started as one of several tasks, every task would start the whole job,
and the srun each one's MPI launcher runs would wait for the CPUs the step holds, forever (seen
under Slurm 22.05: `srun -n 2 scaleoutrun ...` hangs). A batch script and salloc's shell are no
step (SLURM_STEP_ID is unset there), so scaleoutrun reads the allocation there only, and refuses
inside a step, naming it and the ways that work.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping, Optional

from .errors import UsageError
from .hosts import HostSlots

__all__ = ["SlurmAllocation", "expand_host_list", "expand_counts", "detect_allocation"]


def _split_top_level(text: str) -> list[str]:
    """Splits at the commas outside brackets: 'a[1,2],b' -> ['a[1,2]', 'b']."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError("nested '['")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("']' without '['")
        elif char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    if depth:
        raise ValueError("'[' without ']'")
    items.append(text[start:])
    return items


def _expand_range_set(body: str) -> list[str]:
    """'01-03,07' -> ['01', '02', '03', '07']. A range keeps its lower bound's width, so that
    zero-padded names stay padded: '098-100' -> 098, 099, 100."""
    values = []
    for part in body.split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"[{body}] is not a list of numbers and ranges")
        if not dash:
            values.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"range {part} runs backwards")
        values += [str(number).zfill(len(low)) for number in range(int(low), int(high) + 1)]
    return values


def _expand_item(item: str) -> list[str]:
    """One host expression, with any number of bracket groups: 'r[1-2]n[1-2]' gives
    r1n1, r1n2, r2n1, r2n2 (the first group varies slowest, as Slurm orders them)."""
    if not item:
        raise ValueError("empty host name")
    pieces: list[list[str]] = []
    rest = item
    while "[" in rest:
        before, _, after = rest.partition("[")
        body, closed, rest = after.partition("]")
        if not closed:
            raise ValueError("'[' without ']'")
        pieces += [[before], _expand_range_set(body)]
    pieces.append([rest])
    return ["".join(parts) for parts in itertools.product(*pieces)]


def expand_host_list(text: str) -> list[str]:
    """Slurm's compressed host list to host names: 'node[01-03,07],gpu5' ->
    node01, node02, node03, node07, gpu5. Raises ValueError for text that is not one."""
    text = text.strip()
    if not text:
        raise ValueError("empty host list")
    return [name for item in _split_top_level(text) for name in _expand_item(item.strip())]


def expand_counts(text: str) -> list[int]:
    """Slurm's run-length encoded counts: '2(x3),1' -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in text.strip().split(","):
        count, times_open, times = item.strip().partition("(x")
        if not count.isdigit():
            raise ValueError(f"{item!r} is not a count")
        repeat = 1
        if times_open:
            if not times.endswith(")") or not times[:-1].isdigit():
                raise ValueError(f"{item!r} is not 'count(xrepeat)'")
            repeat = int(times[:-1])
        counts += [int(count)] * repeat
    return counts


@dataclass(frozen=True)
class SlurmAllocation:
    job_id: str
    hosts: tuple[HostSlots, ...]  # each node with its tasks, in Slurm's node order
    ntasks: Optional[int]  # SLURM_NTASKS, when set

    def describe(self) -> str:
        return f"the Slurm allocation of job {self.job_id}"


def _first(environ: Mapping[str, str], *names: str) -> tuple[str, str]:
    for name in names:
        if environ.get(name, "").strip():
            return name, environ[name]
    return names[0], ""


def _inside_a_step(environ: Mapping[str, str], job_id: str) -> Optional[str]:
    """Why the allocation cannot be read inside an srun step (Note [Inside an srun step]), or
    None outside one."""
    step_name, step = _first(environ, "SLURM_STEP_ID", "SLURM_STEPID")
    if not step.strip():
        return None
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "").strip() or "?"
    several = tasks.isdigit() and int(tasks) > 1
    return (
        f"scaleoutrun is running inside srun's job step {job_id}.{step.strip()} "
        f"({step_name}={step.strip()}, SLURM_STEP_NUM_TASKS={tasks}), whose SLURM_NTASKS and "
        "SLURM_TASKS_PER_NODE are the step's, not the allocation's"
        + (
            ", and each of its tasks would start the whole job (their srun waiting forever for "
            "the CPUs the step holds)"
            if several
            else ""
        )
        + ". Run scaleoutrun once, directly in the allocation (salloc's shell or an sbatch "
        "script, not under srun); or let srun start the ranks without scaleoutrun "
        "(srun --mpi=pmi2 python train.py for MPICH and Intel MPI, --mpi=pmix for Open MPI); or "
        "name the hosts with -H or --hostfile "
        "and --slurm off"
    )


def detect_allocation(environ: Mapping[str, str]) -> Optional[SlurmAllocation]:
    """The allocation scaleoutrun runs inside, or None outside one.

    Nodes come from SLURM_JOB_NODELIST, tasks per node from SLURM_TASKS_PER_NODE (one each when
    absent). Variables that are present but unreadable, or that disagree on the number of
    nodes, are a UsageError naming them; so is running inside an srun step, whose variables
    describe the step (Note [Inside an srun step]).
    """
    _, job_id = _first(environ, "SLURM_JOB_ID", "SLURM_JOBID")
    list_name, node_list = _first(environ, "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if not job_id or not node_list:
        return None
    step_error = _inside_a_step(environ, job_id)
    if step_error:
        raise UsageError(step_error)
    try:
        nodes = expand_host_list(node_list)
    except ValueError as exc:
        raise UsageError(f"{list_name}={node_list!r}: {exc}") from None
    tasks_name, tasks_text = _first(environ, "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE")
    if tasks_text:
        try:
            counts = expand_counts(tasks_text)
        except ValueError as exc:
            raise UsageError(f"{tasks_name}={tasks_text!r}: {exc}") from None
        if len(counts) != len(nodes):
            raise UsageError(
                f"{tasks_name}={tasks_text!r} gives {len(counts)} node(s) but "
                f"{list_name}={node_list!r} names {len(nodes)}"
            )
    else:
        counts = [1] * len(nodes)
    ntasks_text = environ.get("SLURM_NTASKS", "").strip() or environ.get("SLURM_NPROCS", "").strip()
    if ntasks_text and not ntasks_text.isdigit():
        raise UsageError(f"SLURM_NTASKS={ntasks_text!r} is not a number")
    hosts = tuple(HostSlots(node, count) for node, count in zip(nodes, counts) if count > 0)
    if not hosts:
        raise UsageError(f"{tasks_name}={tasks_text!r} gives no node any task")
    return SlurmAllocation(
        job_id=job_id, hosts=hosts, ntasks=int(ntasks_text) if ntasks_text else None
    )
