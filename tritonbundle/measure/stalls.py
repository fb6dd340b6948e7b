"""Host stalls: how late a process that does nothing but sleep 1 ms wakes up, sampled through every load
level, so a level's missed p99 can be laid beside what the host did to a process that is not ours.

A level of the bench lasts a few seconds: at 11,000 req/s the p99 of a 4 s window is its slowest 440
requests, 40 ms of arrivals, so one pause of the server's processes longer than the SLO in a window
misses the level, however much headroom the GPU has. Such a pause can be ours (a collector, a queue)
or the host's (the hypervisor or another tenant taking the cores; the steal counter does not always
show it). The probe tells them apart: it runs in its own process, holds no lock of ours and uses ~2 %
of a core, so it is late only when the kernel did not run it. Linux wakes a sleeper within the timer
slack (50 us by default) when a core is free; a wake-up milliseconds late means no core was given to
it for that long: the host was short of cores (ours all busy, or taken away from the machine).

Beside it, the kernel's CPU pressure (``/proc/pressure/cpu``, "some": the share of time at least one
runnable task waited for a core, read at each heartbeat). The two tell apart whose the missing cores
were: this machine's own tasks outnumbering its cores (pressure up, the probe late) or the machine's
cores not being run at all, by the hypervisor or its host (the probe late, no pressure: inside a
virtual machine a descheduled vCPU leaves its task "running").

``python -m tritonbundle.measure.stalls --seconds 60`` runs the probe alone and prints what it saw: run it
on an idle machine to see whether the host itself stalls.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tritonbundle.proc import python_child_env, stop_reader

#: The probe's sleep per tick.
TICK_S = 0.001
#: A wake-up at least this late (ms) is a stall, reported to the parent with its time.
STALL_MS = 2.0
#: A stall at least this long (ms) is counted apart: long enough to show in a p99 of tens of ms.
LONG_STALL_MS = 5.0
#: The probe says it is alive this often (s), with its tick count, so a window knows it was watched.
HEARTBEAT_S = 0.5
#: What :meth:`StallProbe.window` adds to a level's record.
STALL_KEYS = ("host_stalls", "host_long_stalls", "host_stall_max_ms", "host_stalled_ms", "host_probe_s", "host_cpu_wait")
#: A level's CPU wait (some task waited for a core this share of the time) is named in the console
#: and marked in bench.md from this share.
CPU_WAIT_SHOWN = 0.05
#: The kernel's CPU pressure (PSI, Linux 4.20+; absent where the kernel was built without it).
PRESSURE = Path("/proc/pressure/cpu")


def cpu_pressure_us(path: Path = PRESSURE) -> int | None:
    """The "some" line's ``total``: microseconds in which at least one runnable task waited for a CPU
    since boot (Documentation/accounting/psi.rst); None where the kernel has no such file."""
    try:
        some = next(line for line in path.read_text().splitlines() if line.startswith("some "))
        return int(some.rsplit("total=", 1)[1])
    except (OSError, StopIteration, IndexError, ValueError):
        return None


def probe(seconds: float, out: IO[str]) -> None:
    """The probe's loop: sleep :data:`TICK_S`; a wake-up :data:`STALL_MS` or more late is written as
    ``<monotonic end> <ms late>``; every :data:`HEARTBEAT_S`, ``# <monotonic> <ticks> <CPU pressure us or ->``
    (:func:`cpu_pressure_us`). ``time.monotonic``
    is CLOCK_MONOTONIC on Linux, the same clock in every process, so the parent can place each line in
    its own windows."""
    end = time.monotonic() + seconds
    ticks, beat = 0, time.monotonic()
    before = beat
    while True:
        time.sleep(TICK_S)
        now = time.monotonic()
        ticks += 1
        # from the last wake-up, not from after this loop's own writes: a pause there counts too
        late_ms = (now - before - TICK_S) * 1000.0
        before = now
        if late_ms >= STALL_MS:
            out.write(f"{now:.6f} {late_ms:.3f}\n")
        if now - beat >= HEARTBEAT_S or now >= end:
            pressure = cpu_pressure_us()
            # stamped after the read: a pause between the two would otherwise count against the next beat
            out.write(f"# {time.monotonic():.6f} {ticks} {'-' if pressure is None else pressure}\n")
            out.flush()
            beat = now
            if now >= end:
                return


@dataclass(frozen=True)
class Stall:
    t: float  # monotonic seconds at the late wake-up
    late_ms: float


class StallProbe:
    """The probe in a child process for as long as the bench runs (:meth:`start`, :meth:`stop`);
    :meth:`window` summarises a span (the same contract as :class:`~.probes.GpuSampler`)."""

    def __init__(self, max_s: float = 24 * 3600.0) -> None:
        self.max_s = max_s
        self.stalls: list[Stall] = []
        self.beats: list[float] = []
        #: (monotonic s, :func:`cpu_pressure_us`) at the heartbeats where the kernel reported it.
        self.pressure: list[tuple[float, int]] = []
        #: Why the probe is not running ("" while it runs, or before it starts).
        self.error = ""
        self._stopping = False
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> StallProbe:
        try:
            self._proc = subprocess.Popen(  # noqa: S603 - this interpreter, this module
                [sys.executable, "-m", "tritonbundle.measure.stalls", "--seconds", str(self.max_s), "--raw"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_child_env())
        except OSError as e:  # a reading, not the run: the run goes on without it
            self.error = f"{type(e).__name__}: {e}"
            return self
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None and self._proc.stderr is not None
        for line in self._proc.stdout:
            with contextlib.suppress(ValueError, IndexError):
                if line.startswith("#"):
                    fields = line.split()
                    self.beats.append(float(fields[1]))
                    if len(fields) > 3 and fields[3] != "-":
                        self.pressure.append((float(fields[1]), int(fields[3])))
                else:
                    t, late = line.split()
                    self.stalls.append(Stall(float(t), float(late)))
        # its output ended: it was stopped, or it failed (a traceback on stderr, e.g. an import error)
        why = [line.strip() for line in self._proc.stderr.read().splitlines() if line.strip()]
        if not self._stopping and why:
            self.error = why[-1]

    def window(self, start: float, end: float) -> dict[str, float | None]:
        """The span's stalls: how many (>= :data:`STALL_MS` late), how many long (>= :data:`LONG_STALL_MS`),
        the longest and their sum (ms), the seconds the probe was seen alive in it, and the share of that
        time in which a task of this machine waited for a CPU (between the first and the last heartbeat
        inside the span; None without two there, or without the kernel's pressure file); all None when it
        was not watched (not started, or died)."""
        beats = list(self.beats)
        # the probe lives from its first heartbeat to its last (it is never restarted): the part of the span
        # inside that life was watched (a beat every HEARTBEAT_S, so the last may be up to that short of ``end``)
        watched = min(end, beats[-1]) - max(start, beats[0]) if beats else 0.0
        if watched <= 0:
            return dict.fromkeys(STALL_KEYS)
        inside = [s.late_ms for s in list(self.stalls) if start <= s.t <= end]
        return {"host_stalls": len(inside), "host_long_stalls": sum(1 for ms in inside if ms >= LONG_STALL_MS),
                "host_stall_max_ms": round(max(inside, default=0.0), 2), "host_stalled_ms": round(sum(inside), 1),
                "host_probe_s": round(watched, 2), "host_cpu_wait": self._cpu_wait(start, end)}

    def _cpu_wait(self, start: float, end: float) -> float | None:
        inside = [(t, us) for t, us in list(self.pressure) if start <= t <= end]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return None
        (t0, us0), (t1, us1) = inside[0], inside[-1]
        return round(min(1.0, (us1 - us0) / 1e6 / (t1 - t0)), 4)

    def stop(self) -> None:
        self._stopping = True
        stop_reader(self._proc, self._thread)


def describe(window: dict[str, float | None]) -> str:
    """One phrase for a window (``""`` when the probe did not watch it)."""
    if window.get("host_probe_s") is None:
        return ""
    n, long_n = int(window.get("host_stalls") or 0), int(window.get("host_long_stalls") or 0)
    wait = window.get("host_cpu_wait")
    pressure = (f"; a task waited for a CPU {100 * wait:.1f} % of the time (/proc/pressure/cpu)" if wait is not None
                else "; no CPU pressure reading (/proc/pressure/cpu)")
    if n == 0:
        return f"no wake-up of the probe was {STALL_MS:g} ms late or more in {window['host_probe_s']:.1f} s{pressure}"
    return (f"the probe woke {STALL_MS:g}+ ms late {n} times ({long_n} of them {LONG_STALL_MS:g}+ ms, the longest "
            f"{window['host_stall_max_ms']:.1f} ms, {window['host_stalled_ms']:.0f} ms in all) in "
            f"{window['host_probe_s']:.1f} s{pressure}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tritonbundle.measure.stalls", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to watch (default 60)")
    parser.add_argument("--raw", action="store_true", help="write the probe's lines (what StallProbe reads)")
    args = parser.parse_args(argv)
    if args.raw:
        with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):
            probe(args.seconds, sys.stdout)
        return 0
    watch = StallProbe(max_s=args.seconds).start()
    t0 = time.monotonic()
    try:
        time.sleep(args.seconds + 2 * HEARTBEAT_S)
    finally:
        watch.stop()
    print(describe(watch.window(t0, t0 + args.seconds)) or f"the probe did not run: {watch.error or 'no heartbeat'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
