#!/usr/bin/env bash
# Makes sure an OpenSSH server binary is present for the remote-session tests (tests/suite/remote.rs
# starts its own sshd on loopback with throwaway keys; nothing here configures or starts a daemon).
# Idempotent: does nothing when /usr/sbin/sshd exists. Prints the sshd path.
set -euo pipefail
exec "$(dirname "$0")/debian-tool.sh" /usr/sbin/sshd openssh-server
