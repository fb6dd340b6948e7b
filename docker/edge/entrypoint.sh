#!/bin/sh
# Entry point of the tritonbundle edge image (docker/Dockerfile.edge): renders the per-deployment
# settings of the edge from the environment, then runs nginx in the foreground with the edge's rules.
#
#   TRITONBUNDLE_EDGE_TRITON_HTTP [triton:8000]  Triton's HTTP address (host:port)
#   TRITONBUNDLE_EDGE_TRITON_GRPC [triton:8001]  Triton's gRPC address (host:port)
#   TRITONBUNDLE_EDGE_GATEWAY [off]              the OpenAI API's gateway (host:port) that /v1/ goes to; off:
#                                                /v1/ answers 404
#   TRITONBUNDLE_EDGE_TENANTS [off]              on: the gateway checks every inference request's key and
#                                                limits (needs TRITONBUNDLE_EDGE_GATEWAY)
#   TRITONBUNDLE_EDGE_MAX_BODY [1m]              largest request body: bytes, or a number with k or m
#   TRITONBUNDLE_EDGE_CAPACITY [derived]         inference requests at Triton at once, per protocol; empty:
#                                                derived from the repository below by limits.py (the queue
#                                                bound of each user-facing model, less 2), else 62
#   TRITONBUNDLE_EDGE_REPOSITORY [/models/model_repository]  the model repository the capacity is read from
#   TRITONBUNDLE_EDGE_CLIENT_REQUESTS [capacity / 2, rounded up]  inference requests in flight per client
#                                                address
#   TRITONBUNDLE_EDGE_REQUESTS [2 x capacity]    inference requests in flight at the edge in all
#   TRITONBUNDLE_EDGE_CLIENT_CONNECTIONS [256]   TCP connections per client address
#   TRITONBUNDLE_EDGE_CONNECTIONS [4096]         TCP connections in all (at most 8192)
#   TRITONBUNDLE_EDGE_CONF_DIR [/tmp/edge]       where nginx.conf and the rendered settings go
#   TRITONBUNDLE_EDGE_RULES [/etc/tritonbundle-edge]  where nginx.conf, the templates and limits.py are
# Empty counts as unset. Over a request limit: HTTP 503 + Retry-After / gRPC UNAVAILABLE at once; over a
# connection limit: the connection is closed as soon as it is accepted (docker/README.md, "The edge").
#
#   tritonbundle-edge              render, check (nginx -t) and run nginx
#   tritonbundle-edge --render     render only, print the folder (tests, debugging)
#   tritonbundle-edge COMMAND ...  anything else runs as given
#
# The rules (docker/edge/nginx.conf) stay one file: it is copied next to the rendered settings.conf and
# stream-settings.conf, which it includes by relative paths, because the image's root file system is
# read-only.
set -eu

rules="${TRITONBUNDLE_EDGE_RULES:-/etc/tritonbundle-edge}"
conf_dir="${TRITONBUNDLE_EDGE_CONF_DIR:-/tmp/edge}"
http="${TRITONBUNDLE_EDGE_TRITON_HTTP:-triton:8000}"
grpc="${TRITONBUNDLE_EDGE_TRITON_GRPC:-triton:8001}"
gateway="${TRITONBUNDLE_EDGE_GATEWAY:-off}"
tenants="${TRITONBUNDLE_EDGE_TENANTS:-off}"  # empty counts as off
max_body="${TRITONBUNDLE_EDGE_MAX_BODY:-1m}"
repository="${TRITONBUNDLE_EDGE_REPOSITORY:-/models/model_repository}"
capacity="${TRITONBUNDLE_EDGE_CAPACITY:-}"
client_requests="${TRITONBUNDLE_EDGE_CLIENT_REQUESTS:-}"
requests="${TRITONBUNDLE_EDGE_REQUESTS:-}"
client_connections="${TRITONBUNDLE_EDGE_CLIENT_CONNECTIONS:-256}"
connections="${TRITONBUNDLE_EDGE_CONNECTIONS:-4096}"
# The capacity when none is set and no repository can be read: the bundle's minilm (limits.py).
default_capacity=62
# nginx.conf's worker_connections (32768) over 3 worker connections per relayed client connection, less
# room for the upstream connections.
max_connections=8192

die() { echo "tritonbundle-edge: $*" >&2; exit 2; }

case "$max_body" in
  '' | *[!0-9kKmM]* | [kKmM]* | *[kKmM]?*) die "TRITONBUNDLE_EDGE_MAX_BODY='$max_body' is not a size (bytes, or a number with k or m: 1m, 512k)" ;;
esac
case "$tenants" in
  on | off) ;;
  *) die "TRITONBUNDLE_EDGE_TENANTS='$tenants' is neither on nor off" ;;
esac
[ "$tenants" = off ] || [ "$gateway" != off ] || die "TRITONBUNDLE_EDGE_TENANTS=on needs the gateway (TRITONBUNDLE_EDGE_GATEWAY)"
gateway_address=127.0.0.1:9
[ "$gateway" = off ] || gateway_address="$gateway"
for address in "$http" "$grpc" "$gateway_address"; do
  case "$address" in
    '' | *[!]A-Za-z0-9.:_[-]* | *: | :*) die "address '$address' (Triton's or the gateway's) is not host:port" ;;
  esac
  case "$address" in
    *:*) ;;
    *) die "address '$address' has no port (host:port)" ;;
  esac
done

# A positive whole number, at most 1000000 (nginx's limit_conn and max_conns take any; this catches typos).
count() {
  case "$2" in
    '' | *[!0-9]* | 0*) die "$1='$2' is not a positive whole number" ;;
  esac
  [ "${#2}" -le 7 ] && [ "$2" -le 1000000 ] || die "$1='$2' is over 1000000"
}

capacity_from=""
if [ -z "$capacity" ]; then
  if [ -d "$repository" ] && command -v python3 >/dev/null 2>&1; then
    capacity="$(python3 "$rules/limits.py" --capacity "$repository")" \
      || die "cannot derive the capacity from $repository (limits.py above); set TRITONBUNDLE_EDGE_CAPACITY"
    capacity_from=" (from $repository)"
  else
    capacity="$default_capacity"
    capacity_from=" (the default: no repository at $repository)"
  fi
fi
count TRITONBUNDLE_EDGE_CAPACITY "$capacity"
[ -n "$client_requests" ] || client_requests=$(( (capacity + 1) / 2 ))
[ -n "$requests" ] || requests=$(( 2 * capacity ))
count TRITONBUNDLE_EDGE_CLIENT_REQUESTS "$client_requests"
count TRITONBUNDLE_EDGE_REQUESTS "$requests"
count TRITONBUNDLE_EDGE_CLIENT_CONNECTIONS "$client_connections"
count TRITONBUNDLE_EDGE_CONNECTIONS "$connections"
[ "$connections" -le "$max_connections" ] \
  || die "TRITONBUNDLE_EDGE_CONNECTIONS=$connections is over $max_connections (nginx.conf's worker_connections / 3)"

render() {
  mkdir -p "$conf_dir"
  cp "$rules/nginx.conf" "$conf_dir/nginx.conf"
  sed -e "s|@TRITON_HTTP@|$http|g" -e "s|@TRITON_GRPC@|$grpc|g" -e "s|@MAX_BODY@|$max_body|g" \
      -e "s|@CAPACITY@|$capacity|g" -e "s|@CLIENT_REQUESTS@|$client_requests|g" -e "s|@REQUESTS@|$requests|g" \
      -e "s|@GATEWAY_ADDRESS@|$gateway_address|g" -e "s|@GATEWAY@|$gateway|g" -e "s|@TENANTS@|$tenants|g" \
    "$rules/settings.conf.template" >"$conf_dir/settings.conf"
  sed -e "s|@CLIENT_CONNECTIONS@|$client_connections|g" -e "s|@CONNECTIONS@|$connections|g" \
    "$rules/stream-settings.conf.template" >"$conf_dir/stream-settings.conf"
}

if [ "${1:-}" = "--render" ]; then
  render
  echo "$conf_dir"
  exit 0
fi

if [ "$#" -gt 0 ]; then
  exec "$@"
fi

render
echo "tritonbundle-edge: HTTP :8080 -> $http (/v1/ -> gateway $gateway; tenants $tenants), gRPC :8081 -> $grpc, request bodies up to $max_body" >&2
echo "tritonbundle-edge: inference requests: $capacity at Triton per protocol$capacity_from, $client_requests per client address, $requests in all; connections: $client_connections per client address, $connections in all" >&2
exec nginx -c "$conf_dir/nginx.conf" -e stderr -g 'daemon off;'
