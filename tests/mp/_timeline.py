"""Reads a timeline file (Note [Timeline]) for the tests: Horovod's layout, a process per
tensor and begin/end events."""

import json


def read(path):
    """(events, rows, spans) of the JSON array at `path`: rows maps each tensor's pid to its
    name; each span is a dict of tensor, name, ts, end (None while it is open) and args (the
    end event's)."""
    with open(path) as f:
        events = json.load(f)
    rows = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("name") == "process_name" and e["pid"] != 0
    }
    begun, spans = {}, []
    for e in events:
        if e.get("ph") == "B":
            span = {"tensor": rows[e["pid"]], "name": e["name"], "ts": e["ts"], "end": None}
            span["args"] = {}
            begun.setdefault(e["pid"], []).append(span)
            spans.append(span)
        elif e.get("ph") == "E":
            span = begun[e["pid"]].pop()
            span["end"], span["args"] = e["ts"], e.get("args", {})
    return events, rows, spans
