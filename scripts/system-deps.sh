#!/usr/bin/env bash
# Install what the tests drive for real: Debian's PostgreSQL (store tests), OpenSSH's sshd (SSH
# backend tests), Chromium (lab panel tests), Slurm's slurmctld + slurmd + client and munge
# (Slurm backend tests; nothing is started or enabled here, the tests start their own cluster)
# and sudo (jobs submitted as their owner), and configurable-http-proxy from npm (the proxy of
# the JupyterHub tests) into the repo-local, gitignored .cache/chp. Skips what is present.
set -euo pipefail
need=()
[ -x /usr/lib/postgresql/15/bin/initdb ] || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/sbin/slurmctld ] || need+=(slurmctld)
[ -x /usr/sbin/slurmd ] || need+=(slurmd)
[ -x /usr/bin/sbatch ] || need+=(slurm-client)
[ -x /usr/sbin/munged ] || need+=(munge)
[ -x /usr/bin/sudo ] || need+=(sudo)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "system-deps: missing ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
  echo "system-deps: installed ${need[*]}"
fi

CHP_VERSION=5.3.0
chp_dir="$(cd "$(dirname "$0")/.." && pwd)/.cache/chp"
chp="$chp_dir/node_modules/.bin/configurable-http-proxy"
if [ "$("$chp" --version 2>/dev/null)" != "$CHP_VERSION" ]; then
  if ! command -v npm >/dev/null; then
    echo "system-deps: configurable-http-proxy needs Node.js >= 20 with npm (the lab extension build needs Node too)" >&2
    exit 1
  fi
  npm install --prefix "$chp_dir" --save-exact --no-audit --no-fund --loglevel=error \
    "configurable-http-proxy@$CHP_VERSION" >/dev/null
  echo "system-deps: installed configurable-http-proxy $CHP_VERSION in $chp_dir"
fi
