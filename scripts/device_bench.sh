#!/usr/bin/env bash
# Run THERE (the GPU machine), in the repository root: install what the carried .device/ folders hold
# into .device/opt (git-ignored, not carried: it survives between calls while the machine stays warm),
# then run `python3 -m tritonbundle bench gpu`. Any phase that fails is reported as failed; the exit
# code is the benchmark's.
#
# usage: bash scripts/device_bench.sh [all|install|run|tune] [tritonbundle bench gpu / tune options...]
#   all      install whatever is carried, then run (the default)
#   install  only install (what the call carries: .device/server, .device/stubs, .device/grpc, .device/http, .device/model)
#   run      only run (a later call; uses .device/opt from before)
#   tune     `tritonbundle tune` instead of the bench (a later call; e.g. --bench-model bert-base)
# Output goes to $OUT (the device tool's folder) or reports/bench: bench.json, bench.md, bench.png,
# logs.tar.gz, console.log, install.log.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-all}
[ $# -gt 0 ] && shift
ROOT=$PWD
OPT=$ROOT/.device/opt
OUT=${OUT:-$ROOT/reports/bench}
mkdir -p "$OUT" "$OPT"
PY=python3
log() { echo "[device_bench $(date +%H:%M:%S)] $*"; }

install() {
  if [ -f .device/server/tritonserver.tar.xz ]; then
    want=$(sha256sum .device/server/tritonserver.tar.xz | cut -d' ' -f1)
    if [ "$(cat "$OPT/server/.sha256" 2>/dev/null)" != "$want" ]; then
      log "unpacking the trimmed tritonserver"
      rm -rf "$OPT/server" && mkdir -p "$OPT/server"
      tar -C "$OPT/server" -xJf .device/server/tritonserver.tar.xz && echo "$want" > "$OPT/server/.sha256"
    fi
    log "installing wheels into $OPT/site"
    wheels=$(ls .device/server/wheels/*.whl | grep -v '/protobuf-')
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$OPT/site" $wheels
    if ! $PY -c "import google.protobuf as p, sys; v=tuple(int(x) for x in p.__version__.split('.')[:3]); sys.exit(0 if v >= (6, 33, 5) else 1)" 2>/dev/null; then
      log "this protobuf is older than tritonclient's generated code needs: installing the carried one"
      $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$OPT/site" .device/server/wheels/protobuf-*.whl
    fi
    cp .device/server/tokenizer.json "$OPT/tokenizer.json"
  fi
  if ls .device/stubs/wheels/numpy-*.whl >/dev/null 2>&1; then
    # The wheel's Python-backend stubs misread numpy 2 arrays (every tensor arrives corrupted), and they
    # run isolated (PYTHONPATH is ignored; packages come from the environment of the python3 on PATH).
    # So: a minimal environment for the stubs, numpy 1.26 first, then this interpreter's packages.
    log "making the stubs' environment (numpy 1.26 + this interpreter's packages) in $OPT/stubenv"
    base=$($PY -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
    ver=$($PY -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    site="$OPT/stubenv/lib/python$ver/site-packages"
    rm -rf "$OPT/stubenv" && mkdir -p "$OPT/stubenv/bin" "$site"
    ln -sf "$base" "$OPT/stubenv/bin/python3"
    ln -sf python3 "$OPT/stubenv/bin/python"
    printf 'home = %s\ninclude-system-site-packages = false\nversion = %s\n' "$(dirname "$base")" \
      "$($PY -c 'import platform; print(platform.python_version())')" > "$OPT/stubenv/pyvenv.cfg"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .device/stubs/wheels/numpy-*.whl
    # The host's packages are linked in one by one, except those built against numpy 2 that the
    # model does not need: under numpy 1.26 they fail to import, and transformers imports them when
    # it finds them (scipy/sklearn through its generation utilities).
    $PY - "$site" <<'PY'
import os, re, sys, sysconfig
deny = re.compile(r"^(numpy|scipy|sklearn|scikit_learn|pandas|jax|jaxlib|jax_cuda\w*|numba|cupy\w*|h5py|statsmodels|cv2|opencv\w*|pyarrow|tensorstore|skimage|scikit_image|xarray|matplotlib|seaborn|numpyro|flax|optax|chex|orbax\w*|torch_geometric|botorch|gpytorch|linear_operator)([-_.].*)?$", re.I)
site = sys.argv[1]
for d in dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]):
    for name in sorted(os.listdir(d)):
        target = os.path.join(site, name)
        if deny.match(name) or os.path.lexists(target) or name == "__pycache__":
            continue
        os.symlink(os.path.join(d, name), target)
PY
  fi
  if ls .device/peer/wheels/*.whl >/dev/null 2>&1; then
    log "installing the LitServe peer's wheels into $OPT/site"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$OPT/site" .device/peer/wheels/*.whl
  fi
  if ls .device/http/wheels/*.whl >/dev/null 2>&1; then
    log "installing tritonclient.http's wheels (geventhttpclient, gevent) into $OPT/site"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$OPT/site" .device/http/wheels/*.whl
  fi
  if ls .device/grpc/wheels/*.whl >/dev/null 2>&1; then
    mkdir -p "$OPT/grpc" && cp .device/grpc/wheels/*.whl "$OPT/grpc/"  # installed by check() only if needed
  fi
  if [ -f .device/model/minilm/weights.json ]; then
    log "restoring the MiniLM weights"
    PYTHONPATH=$ROOT $PY scripts/device_pack.py unpack-model .device/model/minilm "$OPT/minilm"
  fi
}

setup_env() {
  export PYTHONPATH=$ROOT:$OPT/site${PYTHONPATH:+:$PYTHONPATH}
  export PATH=$(dirname "$($PY -c 'import sys; print(sys.executable)')"):$PATH
  export TRITONSERVER=$OPT/server/tritonserver/bin/tritonserver
  export TRITON_BACKEND_DIR=$OPT/server/tritonserver/backends
  # The Python 3.12 stub embeds libpython3.12.so.1.0: the interpreter's own, found through its LIBDIR.
  pylib=$($PY -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')
  for d in "$pylib" /usr/lib/x86_64-linux-gnu /usr/local/lib; do
    if [ -n "$d" ] && [ -e "$d/libpython3.12.so.1.0" ]; then pylib=$d; break; fi
  done
  export LD_LIBRARY_PATH=$OPT/server/lib${pylib:+:$pylib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  [ -x "$OPT/stubenv/bin/python3" ] && export TRITONBUNDLE_STUB_BIN=$OPT/stubenv/bin
  [ -f "$OPT/minilm/model.safetensors" ] && export TRITONBUNDLE_MINILM_DIR=$OPT/minilm
  [ -f "$OPT/tokenizer.json" ] && export TRITONBUNDLE_TOKENIZER=$OPT/tokenizer.json
  export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
}

check() {
  log "checks"
  nvidia-smi --query-gpu=name,driver_version,memory.total,utilization.gpu --format=csv,noheader || true
  $PY - <<'PY' || true
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for name in ("torch", "transformers", "tokenizers", "safetensors", "numpy", "grpc", "google.protobuf", "aiohttp", "pynvml", "psutil", "uvloop", "litserve", "fastapi", "zmq"):
    try:
        m = importlib.import_module(name)
        print(f"  {name} {getattr(m, '__version__', '?')}")
    except Exception as e:
        print(f"  {name}: MISSING ({type(e).__name__}: {e})")
import torch
print("  cuda", torch.cuda.is_available(), torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
PY
  if [ -n "${TRITONBUNDLE_STUB_BIN:-}" ]; then
    log "the stubs' environment:"
    PYTHONPATH= "$TRITONBUNDLE_STUB_BIN/python3" -I -c "import numpy, torch, transformers, tokenizers, safetensors; print('  numpy', numpy.__version__, numpy.__file__); print('  torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())" \
      || log "WARNING: the stubs' environment does not import numpy/torch/transformers: the bundle phase will fail"
    PYTHONPATH= "$TRITONBUNDLE_STUB_BIN/python3" -c "from transformers.models.bert.modeling_bert import BertModel; print('  BertModel imports in the stubs environment')" 2>&1 | tail -4
  else
    $PY -c "import numpy, sys; sys.exit(0 if int(numpy.__version__.split('.')[0]) < 2 else 1)" \
      || log "WARNING: numpy 2 here and no .device/stubs carried: the Python-backend stubs will read corrupted tensors"
  fi
  if ! $PY -c "import tritonclient.grpc.aio, tritonclient.grpc.model_config_pb2" 2>"$OPT/import.err"; then
    if grep -q "grpc package installed is at version" "$OPT/import.err"; then
      if ls "$OPT"/grpc/grpcio-*.whl >/dev/null 2>&1; then
        log "this grpcio is older than tritonclient's generated code asks for: installing the carried one"
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$OPT/site" "$OPT"/grpc/grpcio-*.whl
      else
        log "this grpcio is older than tritonclient's generated code asks for: relaxing that check (carry .device/grpc to avoid this)"
        sed -i 's/^if _version_not_supported:/if False:  # relaxed by scripts\/device_bench.sh (older grpcio)/' "$OPT/site/tritonclient/grpc/service_pb2_grpc.py"
      fi
    fi
    $PY -c "import tritonclient.grpc.aio, tritonclient.grpc.model_config_pb2" || log "WARNING: tritonclient does not import: the bundle phase will fail"
  fi
  $PY -c "import tritonclient.http.aio" 2>/dev/null \
    || log "note: tritonclient.http does not import (carry .device/http): TRITONBUNDLE_LOAD_SENDER=http and HTTP clients will fail"
  if [ -x "$TRITONSERVER" ]; then
    missing=$(ldd "$TRITONSERVER" "$TRITON_BACKEND_DIR/python/libtriton_python.so" "$TRITON_BACKEND_DIR/python/triton_python_backend_stub" | grep "not found" | sort -u)
    [ -n "$missing" ] && log "WARNING: unresolved libraries (the bundle phase will fail): $missing"
  else
    log "WARNING: no tritonserver at $TRITONSERVER (carry .device/server): the bundle phase will fail"
  fi
  [ -n "${TRITONBUNDLE_MINILM_DIR:-}" ] || log "WARNING: no MiniLM weights (carry .device/model): the minilm model will fail to build"
  df -h /dev/shm | tail -1
}

# A run killed before it could clean up (a call that hit its time limit) leaves its servers running in
# their own sessions. Every process a run starts inherits TRITONBUNDLE_DEVICE_RUN from this script:
# end any that carry it, before this run sets it and measures anything.
for environ in /proc/[0-9]*/environ; do
  pid=${environ#/proc/}; pid=${pid%/environ}
  if [ "$pid" != "$$" ] && grep -qa "TRITONBUNDLE_DEVICE_RUN=" "$environ" 2>/dev/null; then
    log "ending process $pid ($(tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null | cut -c1-80)) left by an earlier run"
    kill -KILL "$pid" 2>/dev/null
  fi
done
export TRITONBUNDLE_DEVICE_RUN=$(date +%s)-$$

case "$MODE" in
  install) install 2>&1 | tee "$OUT/install.log"; setup_env; check 2>&1 | tee -a "$OUT/install.log"; exit 0 ;;
  run) setup_env ;;
  tune)
    setup_env
    log "python3 -m tritonbundle tune --out $OUT --work $OPT/tune-work $*"
    rm -rf "$OPT/tune-work"
    $PY -m tritonbundle tune --out "$OUT" --work "$OPT/tune-work" "$@" 2>&1 | tee "$OUT/console.log"
    code=${PIPESTATUS[0]}
    tar -C "$OPT/tune-work" -czf "$OUT/logs.tar.gz" --exclude='*.safetensors' --exclude='*.onnx' --exclude='*.bin' . 2>/dev/null
    exit "$code" ;;
  all) install 2>&1 | tee "$OUT/install.log"; setup_env; check 2>&1 | tee -a "$OUT/install.log" ;;
  *) echo "usage: $0 [all|install|run|tune] [bench or tune options]"; exit 2 ;;
esac

log "python3 -m tritonbundle bench gpu --out $OUT $*"
$PY -m tritonbundle bench gpu --out "$OUT" "$@" 2>&1 | tee "$OUT/console.log"
exit "${PIPESTATUS[0]}"
