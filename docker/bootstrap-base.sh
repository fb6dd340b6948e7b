#!/bin/sh
# Print the Debian bookworm + Python 3.11 base image to build the CPU, export and loadtest images FROM
# (the PYTHON_BASE_IMAGE build argument), making one locally when no registry can be reached.
#
#   export PYTHON_BASE_IMAGE="$(docker/bootstrap-base.sh)"
#
# In this order, the first that works:
#   1. the local image $TRITONBUNDLE_LOCAL_BASE already exists (made by an earlier run): use it;
#   2. the public image $TRITONBUNDLE_PUBLIC_BASE is here or can be pulled (within 60 s): use it;
#   3. debootstrap a minimal bookworm root filesystem (python3, python3-venv, ca-certificates,
#      libpython3.11; under a minute from a Debian mirror) and `docker import` it as
#      $TRITONBUNDLE_LOCAL_BASE. Needs root and debootstrap (docker/engine.sh installs it).
# Only the image reference goes to stdout; progress goes to stderr. --local skips step 2 (an
# air-gapped site that wants the bootstrapped image even where Docker Hub answers).
set -eu

PUBLIC="${TRITONBUNDLE_PUBLIC_BASE:-debian:bookworm-slim}"
LOCAL="${TRITONBUNDLE_LOCAL_BASE:-localhost/tritonbundle-base:bookworm-py3.11}"
MIRROR="${TRITONBUNDLE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="python3,python3-venv,ca-certificates,libpython3.11"

log() { echo "bootstrap-base.sh: $*" >&2; }
have() { timeout 30 docker image inspect "$1" >/dev/null 2>&1; }

if have "$LOCAL"; then
  log "using $LOCAL (already bootstrapped)"
  echo "$LOCAL"
  exit 0
fi

if [ "${1:-}" != "--local" ]; then
  if have "$PUBLIC"; then
    echo "$PUBLIC"
    exit 0
  fi
  log "pulling $PUBLIC"
  if timeout 60 docker pull -q "$PUBLIC" >/dev/null 2>&1; then
    echo "$PUBLIC"
    exit 0
  fi
  log "$PUBLIC cannot be pulled here: bootstrapping $LOCAL from $MIRROR"
fi

command -v debootstrap >/dev/null 2>&1 || { log "error: debootstrap not found (apt-get install debootstrap, or run docker/engine.sh)"; exit 1; }
[ "$(id -u)" = 0 ] || { log "error: debootstrap needs root"; exit 1; }

work="$(mktemp -d /var/tmp/tritonbundle-base.XXXXXX)"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
started="$(date +%s)"
timeout 900 debootstrap --variant=minbase --include="$PACKAGES" bookworm "$rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2
  log "error: debootstrap failed"
  exit 1
}
# What a container image does not need: downloaded packages, package lists, logs, machine identity.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* \
  "$rootfs"/debootstrap "$rootfs"/tmp/* "$rootfs"/var/tmp/*
: >"$rootfs/etc/machine-id"
cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
tar -C "$rootfs" --numeric-owner -c . | timeout 300 docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  --message "debootstrap --variant=minbase --include=$PACKAGES bookworm ($MIRROR)" \
  - "$LOCAL" >/dev/null
log "bootstrapped $LOCAL in $(( $(date +%s) - started ))s"
echo "$LOCAL"
