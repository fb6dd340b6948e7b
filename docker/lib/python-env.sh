#!/bin/sh
# Image build helper (bind-mounted into RUN steps; not copied into any image):
#
#   python-env.sh VENV [--system-site-packages] [--libpython]
#
# 1. makes sure the base image has python3 (+ venv support) and CA certificates, installing them with
#    apt-get only when missing (the bootstrapped bookworm base and the NGC images already have them;
#    debian:bookworm-slim does not);
# 2. with --libpython: the shared libpython of that Python (the CPU tritonserver's Python backend stub
#    embeds it);
# 3. creates user and group 1000 when the image has none (the NGC images have uid 1000 already:
#    `triton-server` / `ubuntu`);
# 4. creates the virtual environment VENV. --system-site-packages lets it see the base image's own
#    packages (tensorrt in the NGC TensorRT image). Where the base has no ensurepip (Ubuntu without
#    python3-venv) but has pip, the environment is made --without-pip: `VENV/bin/python -m pip` then runs
#    the base's pip module and installs into the environment. A bare `pip` would be the system's (system
#    site-packages, or refused by PEP 668 on Ubuntu 24.04): the Dockerfiles never call one
#    (tests/docker/test_dockerfiles.py).
set -eu
venv="$1"
shift
system_site=""
libpython=0
for arg in "$@"; do
  case "$arg" in
    --system-site-packages) system_site="--system-site-packages" ;;
    --libpython) libpython=1 ;;
    *) echo "python-env.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

apt_updated=0
apt_install() {
  command -v apt-get >/dev/null 2>&1 || { echo "python-env.sh: need $* but the base image has no apt-get" >&2; exit 1; }
  if [ "$apt_updated" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

if ! command -v python3 >/dev/null 2>&1; then
  apt_install python3 python3-venv ca-certificates
fi
[ -f /etc/ssl/certs/ca-certificates.crt ] || apt_install ca-certificates
version="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$libpython" = 1 ] && ! python3 -c "import ctypes.util, sys; sys.exit(0 if ctypes.util.find_library('python$version') else 1)"; then
  apt_install "libpython$version"
fi

getent group 1000 >/dev/null 2>&1 || groupadd --gid 1000 tritonbundle
getent passwd 1000 >/dev/null 2>&1 || useradd --uid 1000 --gid 1000 --no-create-home --home-dir /tmp \
  --shell /usr/sbin/nologin tritonbundle

if ! python3 -m venv $system_site "$venv" 2>/dev/null; then
  rm -rf "$venv"
  if python3 -m pip --version >/dev/null 2>&1; then
    python3 -m venv --without-pip --system-site-packages "$venv"
  else
    apt_install "python$version-venv"
    python3 -m venv $system_site "$venv"
  fi
fi
"$venv/bin/python" -m pip --version

if [ "$apt_updated" = 1 ]; then
  apt-get clean
  rm -rf /var/lib/apt/lists/*
fi
