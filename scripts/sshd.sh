#!/usr/bin/env bash
# Makes sure an OpenSSH server binary is present for the remote-session tests (tests/suite/remote.rs
# starts its own sshd on loopback with throwaway keys; nothing here configures or starts a daemon).
# Idempotent: does nothing when /usr/sbin/sshd exists. Prints the sshd path.
set -euo pipefail
SSHD=/usr/sbin/sshd
if [ ! -x "$SSHD" ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "sshd is missing and apt-get is not available: install openssh-server" >&2
    exit 1
  fi
  SUDO=
  [ "$(id -u)" = 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >&2
  # No daemon is started by the package in a container without an init system; if one is, it
  # does not matter: the tests use their own config and port.
  $SUDO apt-get install -y -qq --no-install-recommends openssh-server >&2
fi
[ -x "$SSHD" ] || { echo "sshd still missing after install" >&2; exit 1; }
echo "$SSHD"
