"""What the benchmark records about the machine: GPU name, driver, utilisation, clocks and power (NVML
through nvidia-ml-py, else ``nvidia-smi``), library versions, and CPU time per process (psutil)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib.metadata as md
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from tritonbundle.gpu_sharing import sharing_from_env
from tritonbundle.measure.wire import sender
from tritonbundle.proc import stop_reader, usable_cpus

LIBRARIES = (
    "torch", "transformers", "tokenizers", "safetensors", "numpy", "tritonclient", "grpcio", "protobuf",
    "aiohttp", "nvidia-ml-py", "psutil", "onnxruntime",
)


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in LIBRARIES:
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "-"
    with contextlib.suppress(Exception):
        import torch

        out["torch.cuda"] = str(torch.version.cuda)
    return out


def _nvml() -> Any | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - no NVML: fall back to nvidia-smi
        return None


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_info(index: int = 0) -> dict[str, Any]:
    """Name, driver, memory, clocks of GPU ``index``; ``{"available": False}`` without one."""
    nvml = _nvml()
    if nvml is not None:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            info = {
                "available": True, "source": "nvml", "name": _decode(nvml.nvmlDeviceGetName(handle)),
                "driver": _decode(nvml.nvmlSystemGetDriverVersion()), "memory_mib": int(mem.total // 2**20),
                "count": int(nvml.nvmlDeviceGetCount()),
            }
            with contextlib.suppress(Exception):
                info["cuda_driver"] = str(nvml.nvmlSystemGetCudaDriverVersion_v2())
            with contextlib.suppress(Exception):
                info["max_sm_clock_mhz"] = int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
            return info
        except Exception as e:  # noqa: BLE001
            return {"available": False, "source": "nvml", "error": str(e)}
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, f"--id={index}", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=10, check=True,
            ).stdout.strip().split(", ")
            return {"available": True, "source": "nvidia-smi", "name": out[0], "driver": out[1], "memory_mib": int(float(out[2]))}
        except Exception as e:  # noqa: BLE001
            return {"available": False, "source": "nvidia-smi", "error": str(e)}
    return {"available": False, "source": "none"}


def physical_cores() -> int | None:
    """Cores without their SMT siblings (psutil), when it can tell: two busy processes on one core's two
    hardware threads each run slower than on two cores."""
    try:
        import psutil

        cores = psutil.cpu_count(logical=False)
        return int(cores) if cores else None
    except Exception:  # noqa: BLE001
        return None


def environment(device: str) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count(),
        "cpus_allowed": len(usable_cpus()), "physical_cores": physical_cores(),
        "python_executable": sys.executable, "device": device, "gpu": gpu_info() if device == "cuda" else None,
        "gpu_sharing": sharing_from_env() if device == "cuda" else None, "load_sender": sender(),
        "versions": versions(),
    }


#: NVML's clock event reasons that mean the GPU slowed itself (power cap, heat, hardware slowdown), as
#: opposed to idling or clocks someone set (nvml.h, ``nvmlClocksEventReason*``: SwPowerCap 0x4,
#: HwSlowdown 0x8, SwThermalSlowdown 0x20, HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80).
SLOWDOWN_REASONS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80

#: The GPU sampler's clock, power and slowdown keys for one window.
CLOCK_KEYS = ("gpu_sm_mhz_mean", "gpu_sm_mhz_min", "gpu_power_w_mean", "gpu_slowed_share")
#: The GPU sampler's keys for one window, as levels and the ceiling record them.
GPU_KEYS = ("gpu_util_mean", "gpu_util_max", "gpu_mem_max_mib", "gpu_samples", *CLOCK_KEYS)


@dataclasses.dataclass(frozen=True)
class GpuSample:
    t: float  # monotonic seconds
    util: float  # % of the sample period a kernel ran
    mem_mib: float
    sm_mhz: float | None = None
    power_w: float | None = None
    #: Whether the GPU had slowed its clocks (power or heat) at the sample; None when unknown.
    slowed: bool | None = None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class GpuSampler:
    """Samples GPU utilisation, memory, SM clock, power and clock slowdowns every ``interval_s`` in a
    thread; ``window`` summarises a span. The clock and power say whether a slow level ran on a GPU that
    had slowed itself (power cap, heat) or on one at full clocks."""

    def __init__(self, index: int = 0, interval_s: float = 0.1) -> None:
        self.index, self.interval_s = index, interval_s
        self.samples: list[GpuSample] = []
        self.source = "none"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> GpuSampler:
        nvml = _nvml()
        if nvml is not None:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(self.index)
                self.source = "nvml"
                self._thread = threading.Thread(target=self._nvml_loop, args=(nvml, handle), daemon=True)
                self._thread.start()
                return self
            except Exception:  # noqa: BLE001
                pass
        smi = shutil.which("nvidia-smi")
        if smi:
            self.source = "nvidia-smi"
            self._proc = subprocess.Popen(  # noqa: S603
                [smi, f"--id={self.index}", "--query-gpu=utilization.gpu,memory.used,clocks.sm,power.draw",
                 "--format=csv,noheader,nounits", f"-lms={int(self.interval_s * 1000)}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )
            self._thread = threading.Thread(target=self._smi_loop, daemon=True)
            self._thread.start()
        return self

    def _nvml_loop(self, nvml: Any, handle: Any) -> None:
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(Exception):
                util = nvml.nvmlDeviceGetUtilizationRates(handle)
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                sm = power = slowed = None
                with contextlib.suppress(Exception):
                    sm = float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
                with contextlib.suppress(Exception):
                    power = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # mW
                with contextlib.suppress(Exception):
                    slowed = bool(reasons(handle) & SLOWDOWN_REASONS) if reasons else None
                self.samples.append(GpuSample(time.monotonic(), float(util.gpu), mem.used / 2**20, sm, power, slowed))

    def _smi_loop(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            with contextlib.suppress(ValueError, IndexError):
                util, mem, *rest = line.strip().split(", ")
                sm, power = ([float(x) if x.replace(".", "", 1).isdigit() else None for x in rest] + [None, None])[:2]
                self.samples.append(GpuSample(time.monotonic(), float(util), float(mem), sm, power))
            if self._stop.is_set():
                break

    def window(self, start: float, end: float) -> dict[str, float | None]:
        """The span's utilisation (mean, max), memory (max), SM clock (mean, min), power (mean) and the
        share of samples the GPU had slowed its clocks in; None where nothing was sampled."""
        inside = [x for x in list(self.samples) if start <= x.t <= end]
        utils = [x.util for x in inside]
        clocks = [x.sm_mhz for x in inside if x.sm_mhz is not None]
        powers = [x.power_w for x in inside if x.power_w is not None]
        slowed = [x.slowed for x in inside if x.slowed is not None]
        return {"gpu_util_mean": _mean(utils), "gpu_util_max": max(utils, default=None),
                "gpu_mem_max_mib": max((x.mem_mib for x in inside), default=None), "gpu_samples": len(inside),
                "gpu_sm_mhz_mean": _mean(clocks), "gpu_sm_mhz_min": min(clocks, default=None),
                "gpu_power_w_mean": _mean(powers), "gpu_slowed_share": _mean([float(x) for x in slowed])}

    def stop(self) -> None:
        self._stop.set()
        stop_reader(self._proc, self._thread)


class CpuMeter:
    """CPU seconds used by process trees (tritonserver and its Python stubs, load generators...)."""

    def __init__(self, roots: Mapping[str, int]) -> None:
        self.roots = dict(roots)
        #: group:role -> processes counted in the last read (4 tokenizer instances are 4 stubs).
        self.processes: dict[str, int] = {}
        #: group:role -> {"pid/tid": (thread name, CPU seconds)} of every thread in the last read (Linux).
        self.threads: dict[str, dict[str, tuple[str, float]]] = {}

    def read(self) -> dict[str, float]:
        """group -> CPU seconds so far, per process name below the group's root (e.g. the stubs)."""
        try:
            import psutil
        except ImportError:
            return {}
        out: dict[str, float] = {}
        self.processes = {}
        self.threads = {}
        for group, pid in self.roots.items():
            try:
                root = psutil.Process(pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for p in procs:
                try:
                    t = p.cpu_times()
                    name = _role(p)
                except psutil.Error:
                    continue
                key = f"{group}:{name}"
                out[key] = out.get(key, 0.0) + t.user + t.system
                self.processes[key] = self.processes.get(key, 0) + 1
                self.threads.setdefault(key, {}).update(thread_times(p.pid))
        return out

    @staticmethod
    def delta(before: Mapping[str, float], after: Mapping[str, float], wall_s: float) -> dict[str, float]:
        """Cores busy per process role over a window (1.0 = one core fully used)."""
        return {k: round((after[k] - before.get(k, 0.0)) / wall_s, 3) for k in after if wall_s > 0}

    @staticmethod
    def busiest_threads(before: Mapping[str, Mapping[str, tuple[str, float]]],
                        after: Mapping[str, Mapping[str, tuple[str, float]]],
                        wall_s: float, top: int = 3) -> dict[str, list[tuple[str, float]]]:
        """Per process role, its ``top`` busiest threads over a window as (thread name, share of one
        core): a thread near 1.0 is saturated whatever the process's total says (tritonserver's gRPC
        inference handlers, two threads in Triton 2.51, are the case in point). A thread seen only
        after counts from zero; a share never goes below zero (a thread id reused meanwhile)."""
        out: dict[str, list[tuple[str, float]]] = {}
        if wall_s <= 0:
            return out
        for role, threads in after.items():
            was = before.get(role, {})
            busy = sorted(((name, max(0.0, cpu - was.get(key, (name, 0.0))[1]) / wall_s)
                           for key, (name, cpu) in threads.items()), key=lambda kv: -kv[1])
            out[role] = [(name, round(cores, 3)) for name, cores in busy[:top]]
        return out


def thread_times(pid: int) -> dict[str, tuple[str, float]]:
    """``{"pid/tid": (name, CPU seconds)}`` of each thread of ``pid``, from ``/proc`` (empty elsewhere,
    or once it has exited). The name is the thread's ``comm``: gRPC and PyTorch name theirs, Triton's
    own threads carry the process's name."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                name, ticks = parse_stat(f.read())
        except (OSError, ValueError, IndexError):
            continue
        out[f"{pid}/{tid}"] = (name, ticks / tick)
    return out


def parse_stat(stat: str) -> tuple[str, int]:
    """A ``/proc/.../stat`` line's name and its user + system CPU time in clock ticks (proc(5): fields
    14 and 15). The name may hold spaces and parentheses: the fields after it follow its last ')'."""
    name = stat[stat.find("(") + 1:stat.rfind(")")]
    fields = stat[stat.rfind(")") + 2:].split()
    return name, int(fields[11]) + int(fields[12])


def _role(proc: Any) -> str:
    """A short role for a process: 'tritonserver', a Python stub's model name, 'python'..."""
    try:
        cmd: Iterable[str] = proc.cmdline()
    except Exception:  # noqa: BLE001
        cmd = []
    cmd = list(cmd)
    exe = os.path.basename(cmd[0]) if cmd else proc.name()
    if exe == "triton_python_backend_stub" and len(cmd) > 1:
        # argv: stub <model path> <shm region> ... ; the model path ends with /<model>/<version>/model.py
        parts = cmd[1].rstrip("/").split("/")
        model = parts[-3] if len(parts) >= 3 else cmd[1]
        return f"stub[{model}]"
    return exe
