#!/usr/bin/env bash
# Sets up what the sandbox tests need: bubblewrap, a Docker daemon and the offline sandbox image.
#   genesys/sandbox/ci_setup.sh [PYTHON]
# Idempotent and quiet. It never fails: what cannot be set up is reported on stderr, and the tests
# that need it skip, saying why. As root on a machine without a running daemon it installs the
# Debian packages (docker.io, bubblewrap) and starts dockerd with no iptables and no bridge, its
# data in a fresh temporary directory.
set -u
PY=${1:-.venv/bin/python}
# The daemon listens where DOCKER_HOST points (a unix socket), else at the usual place.
SOCKET=/var/run/docker.sock
case "${DOCKER_HOST:-}" in unix://*) SOCKET=${DOCKER_HOST#unix://} ;; esac
say() { echo "sandbox setup: $*" >&2; }
is_root() { [ "$(id -u)" = 0 ]; }
daemon_answers() { "$PY" -c "import docker; docker.from_env(timeout=5).ping()" >/dev/null 2>&1; }

missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v dockerd >/dev/null 2>&1 || daemon_answers || missing+=(docker.io)
if [ ${#missing[@]} -gt 0 ]; then
  if is_root && command -v apt-get >/dev/null 2>&1; then
    log=$(mktemp /tmp/genesys-apt.XXXXXX.log)
    if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}") >"$log" 2>&1; then
      say "apt-get install ${missing[*]} failed; see $log"
    fi
  else
    say "cannot install ${missing[*]}: needs root and apt-get"
  fi
fi

if ! daemon_answers; then
  if is_root && command -v dockerd >/dev/null 2>&1; then
    dir=$(mktemp -d /tmp/genesys-dockerd.XXXXXX)
    nohup dockerd --iptables=false --bridge=none --data-root "$dir/data" --exec-root "$dir/exec" \
      --pidfile "$dir/dockerd.pid" -H "unix://$SOCKET" >"$dir/dockerd.log" 2>&1 &
    for _ in $(seq 60); do daemon_answers && break; sleep 0.5; done
    daemon_answers || say "dockerd did not start; see $dir/dockerd.log (docker tests will skip)"
  else
    say "no Docker daemon answers and none can be started here (docker tests will skip)"
  fi
fi

if daemon_answers; then
  if ! out=$("$PY" -m genesys.cli sandbox build --offline 2>&1); then
    say "building the sandbox image failed (docker tests will skip):"
    echo "$out" >&2
  fi
fi
exit 0
