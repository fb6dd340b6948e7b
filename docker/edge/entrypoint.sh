#!/bin/sh
# Entry point of the tritonbundle edge image (docker/Dockerfile.edge): renders the per-deployment
# settings of the edge from the environment, then runs nginx in the foreground with the edge's rules.
#
#   TRITONBUNDLE_EDGE_TRITON_HTTP [triton:8000]  Triton's HTTP address (host:port)
#   TRITONBUNDLE_EDGE_TRITON_GRPC [triton:8001]  Triton's gRPC address (host:port)
#   TRITONBUNDLE_EDGE_MAX_BODY [1m]              largest request body: bytes, or a number with k or m
#   TRITONBUNDLE_EDGE_CONF_DIR [/tmp/edge]       where nginx.conf and the rendered settings.conf go
#   TRITONBUNDLE_EDGE_RULES [/etc/tritonbundle-edge]  where nginx.conf and settings.conf.template are
#
#   tritonbundle-edge              render, check (nginx -t) and run nginx
#   tritonbundle-edge --render     render only, print the folder (tests, debugging)
#   tritonbundle-edge COMMAND ...  anything else runs as given
#
# The rules (docker/edge/nginx.conf) stay one file: it is copied next to the rendered settings.conf,
# which it includes by a relative path, because the image's root file system is read-only.
set -eu

rules="${TRITONBUNDLE_EDGE_RULES:-/etc/tritonbundle-edge}"
conf_dir="${TRITONBUNDLE_EDGE_CONF_DIR:-/tmp/edge}"
http="${TRITONBUNDLE_EDGE_TRITON_HTTP:-triton:8000}"
grpc="${TRITONBUNDLE_EDGE_TRITON_GRPC:-triton:8001}"
max_body="${TRITONBUNDLE_EDGE_MAX_BODY:-1m}"

die() { echo "tritonbundle-edge: $*" >&2; exit 2; }

case "$max_body" in
  '' | *[!0-9kKmM]* | [kKmM]* | *[kKmM]?*) die "TRITONBUNDLE_EDGE_MAX_BODY='$max_body' is not a size (bytes, or a number with k or m: 1m, 512k)" ;;
esac
for address in "$http" "$grpc"; do
  case "$address" in
    '' | *[!]A-Za-z0-9.:_[-]* | *: | :*) die "Triton address '$address' is not host:port" ;;
  esac
  case "$address" in
    *:*) ;;
    *) die "Triton address '$address' has no port (host:port)" ;;
  esac
done

render() {
  mkdir -p "$conf_dir"
  cp "$rules/nginx.conf" "$conf_dir/nginx.conf"
  sed -e "s|@TRITON_HTTP@|$http|g" -e "s|@TRITON_GRPC@|$grpc|g" -e "s|@MAX_BODY@|$max_body|g" \
    "$rules/settings.conf.template" >"$conf_dir/settings.conf"
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
echo "tritonbundle-edge: HTTP :8080 -> $http, gRPC :8081 -> $grpc, request bodies up to $max_body" >&2
exec nginx -c "$conf_dir/nginx.conf" -e stderr -g 'daemon off;'
