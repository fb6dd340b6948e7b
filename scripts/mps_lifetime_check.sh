#!/usr/bin/env bash
# Run THERE (a GPU machine with nvidia-cuda-mps-control), in the repository root: does the private MPS
# daemon that tritonbundle starts (tritonbundle/gpu_sharing.py, `-f` in its own process group) serve a
# CUDA client, quit cleanly, and die with its starter when the starter is SIGKILLed? Prints what `ps`
# sees after each step; no output folder. Needs python3 with torch (the client).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mps() { ps -eo pid,ppid,pgid,args | grep '[n]vidia-cuda-mps' || echo "  (no nvidia-cuda-mps process)"; }
client='import torch, time; x = torch.ones(1 << 20, device="cuda"); print("  client sum", float(x.sum()), flush=True); time.sleep(float(__import__("sys").argv[1]))'
echo "== before"; mps

echo "== 1. start, a CUDA client, get_server_list, stop (quit)"
python3 - "$client" <<'PY'
import os, subprocess, sys, time
from tritonbundle.gpu_sharing import MpsDaemon
d = MpsDaemon(); env = d.start(die_with_parent=True)
subprocess.run([sys.executable, "-c", sys.argv[1], "0"], env={**os.environ, **env}, check=True)
print("  servers after the client:", d.servers(), flush=True)
subprocess.run("ps -eo pid,ppid,pgid,args | grep '[n]vidia-cuda-mps'", shell=True)
t = time.monotonic(); d.stop(); print(f"  stop() took {time.monotonic() - t:.2f} s", flush=True)
PY
sleep 1; echo "  after stop:"; mps

echo "== 2. start, a client still connected, then SIGKILL the starter"
python3 - "$client" > /tmp/mps-starter.out 2>&1 <<'PY' &
import os, subprocess, sys, time
from tritonbundle.gpu_sharing import MpsDaemon
env = MpsDaemon().start(die_with_parent=True)
subprocess.Popen([sys.executable, "-c", sys.argv[1], "20"], env={**os.environ, **env})
time.sleep(600)
PY
starter=$!
sleep 8; echo "  starter $starter, with a client connected:"; mps; cat /tmp/mps-starter.out
kill -9 $starter; sleep 3; echo "  3 s after SIGKILL of the starter:"; mps
sleep 20; echo "  after the client's end:"; mps
pkill -9 -f nvidia-cuda-mps; rm -rf /tmp/tritonbundle-mps-*
