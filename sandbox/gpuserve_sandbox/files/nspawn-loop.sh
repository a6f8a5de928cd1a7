#!/bin/bash
# gpuserve sandbox, internal: run one host's systemd-nspawn and boot it again when it reboots
# (nspawn exits 133 on `systemctl reboot`, like RestartForceExitStatus=133 in
# systemd-nspawn@.service). Before every boot the simulated GPU driver state is refreshed
# (a stand-in kernel module installed since the last boot is "loaded" now).
# SIGTERM to this script = orderly shutdown of the host (nspawn sends SIGRTMIN+3 to its systemd).
#   usage: nspawn-loop.sh PYTHON ROOT PROC_DRIVER_DIR -- nspawn-args...
PY=$1 ROOT=$2 PROC_DRIVER=$3; shift 4
stop=0; child=
trap 'stop=1; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM INT
while :; do
  "$PY" -m gpuserve_sandbox.simgpu on-boot "$ROOT" "$PROC_DRIVER" || echo "[nspawn-loop] sim refresh failed"
  systemd-nspawn "$@" &
  child=$!
  while :; do
    wait "$child"; rc=$?
    kill -0 "$child" 2>/dev/null || break     # wait was interrupted by our trap: keep waiting
  done
  child=
  echo "[nspawn-loop] nspawn exited rc=$rc"
  [ "$stop" = 0 ] && [ "$rc" = 133 ] || exit "$rc"
done
