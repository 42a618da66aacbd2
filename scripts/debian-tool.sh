#!/usr/bin/env bash
# Usage: scripts/debian-tool.sh PATH PACKAGE — makes sure the program PATH is present, installing
# Debian's PACKAGE with apt-get when it is not (the tests need a few system tools: sshd for the
# remote-session tests, valgrind for the parser test). Idempotent; prints PATH.
set -euo pipefail
tool=$1 package=$2
if [ ! -x "$tool" ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "$tool is missing and apt-get is not available: install $package" >&2
    exit 1
  fi
  SUDO=
  [ "$(id -u)" = 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >&2
  # A package that ships a daemon starts none in a container without an init system; if one
  # starts, it does not matter: the tests use their own config and port.
  $SUDO apt-get install -y -qq --no-install-recommends "$package" >&2
fi
[ -x "$tool" ] || { echo "$tool still missing after installing $package" >&2; exit 1; }
echo "$tool"
