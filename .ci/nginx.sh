#!/bin/sh
# Debian's nginx with the stream module, for the tests that run the edge's configuration in nginx itself
# (tests/helm/test_edge.py: the chart's and the compose edge's configuration through `nginx -t`;
# tests/gateway/test_edge_tenants.py: tenants' keys checked at the edge in front of the real tritonserver).
# Installed only when missing; no service is started (a policy-rc.d refuses it while apt runs, when the
# machine has none of its own). Exits non-zero when it cannot install them.
set -eu
if { command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; } && ls /etc/nginx/modules-enabled/*stream* >/dev/null 2>&1; then
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "nginx.sh: installing nginx needs root" >&2; exit 1; }
command -v apt-get >/dev/null 2>&1 || { echo "nginx.sh: no apt-get to install nginx with" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
policy=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  policy=/usr/sbin/policy-rc.d
fi
trap 'rm -f $policy' EXIT
# An update only when the package lists do not know the packages yet.
apt-cache show nginx libnginx-mod-stream >/dev/null 2>&1 || timeout 300 apt-get update -q >/dev/null
timeout 600 apt-get install -y -q --no-install-recommends nginx libnginx-mod-stream >/dev/null
echo "nginx.sh: $(/usr/sbin/nginx -v 2>&1) installed" >&2
