#!/usr/bin/env bash
# Install the Debian packages that the tests drive for real: PostgreSQL (store tests),
# OpenSSH's sshd (SSH backend tests) and Chromium (lab panel tests). Skips what is present.
set -euo pipefail
need=()
[ -x /usr/lib/postgresql/15/bin/initdb ] || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
[ -x /usr/bin/chromium ] || need+=(chromium)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "system-deps: missing ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
echo "system-deps: installed ${need[*]}"
