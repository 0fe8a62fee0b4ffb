"""Processes and memory, read from /proc: command lines, liveness, process trees, PSS."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable


def command_line(pid: int) -> list[bytes] | None:
    """The arguments `pid` was started with (/proc/<pid>/cmdline); None once it has exited."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return None


def process_alive(pid: int) -> bool:
    """Whether `pid` runs: it exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def process_tree(roots: Iterable[int]) -> list[int]:
    """`roots` and all their live descendants (from /proc/*/stat parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    seen: list[int] = []
    stack = [r for r in roots if os.path.exists(f"/proc/{r}")]
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.append(pid)
        stack.extend(children.get(pid, ()))
    return seen


@dataclasses.dataclass(frozen=True)
class PssReading:
    """Summed proportional set size of a set of processes, and which of them could not be read.

    pss_bytes: the sum over the processes read. unreadable: pids that exist but whose
    /proc/<pid>/smaps_rollup could not be read (permissions, a kernel without it): their
    memory is missing from pss_bytes, so a report must say so. exited: pids gone before
    they were read (nothing of theirs is live).
    """

    pss_bytes: int
    read: int
    unreadable: tuple[int, ...]
    exited: tuple[int, ...]


def read_pss(pids: Iterable[int]) -> PssReading:
    """The PSS of `pids` (/proc/<pid>/smaps_rollup), counting the processes it could not read."""
    total, read, unreadable, exited = 0, 0, [], []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                pss = next((int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:")), None)
        except (FileNotFoundError, ProcessLookupError):
            exited.append(pid)
            continue
        except OSError:
            (unreadable if os.path.exists(f"/proc/{pid}") else exited).append(pid)
            continue
        if pss is None:  # no memory map: a zombie holds no memory; anything else is unaccounted for
            (unreadable if process_alive(pid) else exited).append(pid)
            continue
        total += pss
        read += 1
    return PssReading(total, read, tuple(unreadable), tuple(exited))
