"""--print-placement: the plan as a table, one row per rank."""

from __future__ import annotations

from typing import Sequence

from .placement import PlacementRequest
from .plan import HostPlacement
from .topology import Topology, format_cpu_list

__all__ = ["format_placement"]

HEADER = ("rank", "host", "socket", "bind", "compute cores", "endpoint cores", "threads")


def format_placement(
    placements: Sequence[HostPlacement], topology: Topology, request: PlacementRequest
) -> str:
    rows = []
    for host in placements:
        for rank in host.plan.ranks:
            rows.append(
                (
                    str(host.first_rank + rank.local_rank),
                    host.host,
                    ",".join(map(str, rank.sockets)),
                    rank.bind,
                    format_cpu_list(rank.cpus) if rank.cpus else "any",
                    format_cpu_list(rank.ep_cpus)
                    if rank.ep_cpus
                    else (f"{rank.ep_servers} unpinned" if rank.ep_servers else "-"),
                    str(rank.threads),
                )
            )
    widths = [max(len(row[i]) for row in rows + [HEADER]) for i in range(len(HEADER))]
    lines = [
        f"this machine: {topology.describe()}; CPUs {format_cpu_list(topology.cpus)}",
        f"request: --bind-to {request.bind_to} --map-by {request.map_by}"
        + (f" --ep-servers {request.ep_servers}" if request.ep_servers is not None else "")
        + (f" --ep-affinity {format_cpu_list(request.ep_affinity)}" if request.ep_affinity else "")
        + (f" --threads-per-rank {request.threads_per_rank}" if request.threads_per_rank else ""),
        "",
    ]
    lines.append("  ".join(title.ljust(width) for title, width in zip(HEADER, widths)).rstrip())
    for row in rows:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    notes = sorted({note for host in placements for note in host.plan.notes})
    if any(not host.local for host in placements):
        notes.append(
            "remote hosts are shown as if they were like this machine; each rank "
            "plans again on its own host"
        )
    lines += [f"note: {note}" for note in notes]
    return "\n".join(lines) + "\n"
