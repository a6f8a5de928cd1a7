"""Stopping the sandbox's daemons must not trip over a daemon that already left."""

import signal
import subprocess

from gpuserve_sandbox import network


def test_signal_pidfile_reaches_a_live_process(tmp_path):
    proc = subprocess.Popen(["sleep", "30"])
    pidfile = tmp_path / "sleep.pid"
    pidfile.write_text(str(proc.pid))
    try:
        assert network.signal_pidfile(pidfile, signal.SIGTERM) == proc.pid
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        proc.kill()


def test_signal_pidfile_when_the_process_is_gone_or_the_file_is_missing(tmp_path):
    # lxcfs leaves on its own when its mount is unmounted; the stop that follows found it gone
    # and raised ProcessLookupError before (a CI failure). Gone is what a stop wants.
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)  # exited and reaped: its pid names no process now
    pidfile = tmp_path / "gone.pid"
    pidfile.write_text(str(proc.pid))
    assert network.signal_pidfile(pidfile, signal.SIGTERM) is None
    assert network.signal_pidfile(tmp_path / "never-written.pid", signal.SIGTERM) is None
    (tmp_path / "garbage.pid").write_text("not a pid\n")
    assert network.signal_pidfile(tmp_path / "garbage.pid", signal.SIGTERM) is None


def test_signal_pidfile_tolerates_the_process_leaving_between_check_and_signal(tmp_path, monkeypatch):
    pidfile = tmp_path / "racy.pid"
    pidfile.write_text("4242")
    monkeypatch.setattr(network, "pid_alive", lambda _: 4242)   # alive at the check ...

    def gone(pid, sig):                                        # ... gone at the signal
        raise ProcessLookupError(3, "No such process")
    monkeypatch.setattr(network.os, "kill", gone)
    assert network.signal_pidfile(pidfile, signal.SIGTERM) is None
