#!/bin/sh
# gpuserve sandbox stand-in daemon: @WHAT@ (version @VERSION@). There is no GPU here.
# Started by systemd as Type=forking: it checks what the real daemon checks, then leaves a
# process behind whose PID is in @PIDFILE@, and exits 0; or it prints the real daemon's kind of
# error and exits 1, so `systemctl start` fails the way it would on a real host.
VERSION=@VERSION@
PIDFILE=@PIDFILE@
loaded=$(head -n1 /proc/driver/nvidia/version 2>/dev/null | grep -o ' [0-9][0-9]*\.[0-9.]*' | head -n1 | tr -d ' ')
if [ -z "$loaded" ]; then
  echo "@WHAT@: the NVIDIA kernel module is not loaded (no /proc/driver/nvidia/version)" >&2
  exit 1
fi
@CHECKS@
mkdir -p "$(dirname "$PIDFILE")"
setsid sleep infinity </dev/null >/dev/null 2>&1 &
echo $! > "$PIDFILE"
