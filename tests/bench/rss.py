"""Memory and CPU of a subject: the sum over its whole process tree, read from /proc.

A subject is often several processes (nginx master + worker, uvicorn supervisor +
workers), so one pid's RSS would flatter it: we add up the root and every
descendant. A background thread samples every `interval` seconds and keeps the peak
per subject; CPU time (user + system) is read on demand to give CPU per request,
which is less sensitive to a noisy shared machine than requests per second.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/pid/stat after the command name (which may contain spaces)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                kids.setdefault(int(fields[1]), []).append(int(entry.name))
    return kids


def tree(root: int, kids: dict[int, list[int]] | None = None) -> Iterator[int]:
    """`root` and all its live descendants (`kids`: a children map to reuse)."""
    kids = _children_map() if kids is None else kids
    stack = [root]
    while stack:
        pid = stack.pop()
        yield pid
        stack.extend(kids.get(pid, ()))


def rss_bytes(root: int, kids: dict[int, list[int]] | None = None) -> int:
    total = 0
    for pid in tree(root, kids):
        try:
            resident = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        total += resident * _PAGE
    return total


def cpu_seconds(root: int) -> float:
    """User + system CPU seconds of the live tree (utime and stime, fields 14-15)."""
    ticks = 0
    for pid in tree(root):
        fields = _stat_fields(pid)
        if fields is not None:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / _TICK


def machine_cpu() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine so far, from /proc/stat.

    Busy is user + nice + system + irq + softirq; the difference between the
    machine's busy time and the benchmark's own over a cell is load from elsewhere
    (a shared machine), reported so a disturbed cell can be recognised.
    """
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6]
    steal = fields[7] if len(fields) > 7 else 0
    return busy / _TICK, steal / _TICK


def processes(root: int) -> int:
    return sum(1 for _ in tree(root))


@dataclass
class Sampler:
    """Peak RSS per named subject, sampled in a daemon thread."""

    interval: float = 0.2
    roots: dict[str, int] = field(default_factory=dict)
    peaks: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def watch(self, name: str, root: int) -> None:
        with self._lock:
            self.roots[name] = root
            self.peaks.setdefault(name, rss_bytes(root))

    def unwatch(self, name: str) -> None:
        self.sample_once()
        with self._lock:
            self.roots.pop(name, None)

    def peak(self, name: str) -> int:
        with self._lock:
            return self.peaks.get(name, 0)

    def sample_once(self) -> None:
        with self._lock:
            roots = dict(self.roots)
        kids = _children_map()  # one /proc scan per sample, shared by every subject
        for name, root in roots.items():
            value = rss_bytes(root, kids)
            with self._lock:
                self.peaks[name] = max(self.peaks.get(name, 0), value)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample_once()

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
