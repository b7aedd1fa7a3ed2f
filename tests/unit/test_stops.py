"""retool_cli/stops.py in a real process receiving real signals: where a stop is raised (at once, at a
`check()` inside `deferred()`, at the end of a `critical()` write), the deadline that kills a stop that will not
end (the process and everything it started), and a second Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

PRELUDE = """
import os, subprocess, sys, time
from retool_cli import stops
stops.install(grace_s=float(sys.argv[1]))
def report(stop):
    print('stopped', stop.name, flush=True)
    sys.exit(stop.exit_code)
"""


def start(body: str, grace_s: float = 20.0) -> subprocess.Popen:
    script = PRELUDE + textwrap.dedent(body)
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(grace_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n", proc.stderr.read() if proc.stderr else ""
    return proc


def finish(proc: subprocess.Popen, signum: int, timeout: float = 20) -> tuple[int, str]:
    proc.send_signal(signum)
    stdout, _ = proc.communicate(timeout=timeout)
    return proc.returncode, stdout


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_a_stop_signal_is_raised_where_the_command_is(signum: int) -> None:
    body = """
    try:
        print('ready', flush=True)
        while True:
            time.sleep(0.01)
    except stops.Stopped as s:
        report(s)
    """
    proc = start(body)
    code, out = finish(proc, signum)
    assert (code, out) == (128 + signum, f"stopped {signal.Signals(signum).name}\n")


def test_deferred_waits_for_check_and_critical_for_its_end() -> None:
    body = """
    try:
        with stops.deferred():
            print('ready', flush=True)
            while stops.requested() is None:
                time.sleep(0.01)
            print('recorded, not raised', flush=True)
            with stops.critical():  # inside deferred(): not raised at its end either
                pass
            print('still here', flush=True)
            stops.check()
    except stops.Stopped as s:
        report(s)
    """
    code, out = finish(start(body), signal.SIGTERM)
    assert (code, out) == (143, "recorded, not raised\nstill here\nstopped SIGTERM\n")
    body = """
    try:
        with stops.critical():
            print('ready', flush=True)
            while stops.requested() is None:
                time.sleep(0.01)
            print('the write ends', flush=True)
        print('never')
    except stops.Stopped as s:
        report(s)
    """
    code, out = finish(start(body), signal.SIGINT)
    assert (code, out) == (130, "the write ends\nstopped SIGINT\n")


def test_a_stop_that_does_not_end_is_killed_with_all_it_started() -> None:
    """A step that never reaches its check (here: a loop in deferred()): after grace_s the process and the
    process it started (in a session of its own, as sandbox workers are) are killed; the exit says the signal."""
    body = """
    child = subprocess.Popen(['sleep', '120'], start_new_session=True)
    print(child.pid, flush=True)
    with stops.deferred():
        print('ready', flush=True)
        while True:
            pass
    """
    script = PRELUDE + textwrap.dedent(body)
    proc = subprocess.Popen([sys.executable, "-c", script, "1.0"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    assert proc.stdout.readline() == "ready\n"
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143
    assert 0.9 < time.monotonic() - started < 10
    time.sleep(0.2)
    with open(f"/proc/{child}/stat") if os.path.exists(f"/proc/{child}/stat") else open(os.devnull) as handle:
        assert handle.read().rsplit(")", 1)[-1].split()[:1] in ([], ["Z"])  # gone (or a zombie of init)


def test_a_second_ctrl_c_stops_at_once_the_same_signal_twice_does_not() -> None:
    body = """
    with stops.deferred():
        print('ready', flush=True)
        while True:
            time.sleep(0.01)
            if stops.requested():
                print('stopping', flush=True)
                break
        while True:
            time.sleep(0.01)
    """
    proc = start(body)
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout is not None and proc.stdout.readline() == "stopping\n"
    proc.send_signal(signal.SIGTERM)  # delivered twice (Slurm and torchrun): one stop
    time.sleep(1.2)
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)  # a person's second Ctrl-C: now
    assert proc.wait(timeout=10) == 130


def test_a_stop_signal_in_the_middle_of_a_log_line_is_said_after_it() -> None:
    """The signal arrives while a log line is being written (here the handler sends it to itself half way): the
    notice that says the stop is logged once that line is whole, not written into it (nor the line twice)."""
    body = """
    import logging, signal
    class Halves(logging.Handler):
        def emit(self, record):
            text = self.format(record)
            sys.stdout.write(text[:6]); sys.stdout.flush()
            if 'interrupted' in text:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # the signal's handler runs here, between two bytecodes of this write
            sys.stdout.write(text[6:] + '\\n'); sys.stdout.flush()
    logging.getLogger().addHandler(Halves())
    logging.getLogger().setLevel(logging.INFO)
    try:
        with stops.deferred():
            print('ready', flush=True)
            time.sleep(0.5)  # (the test has read 'ready' alone)
            logging.getLogger('run').info('a line interrupted by a stop signal')
            time.sleep(0.5)
            stops.check()
    except stops.Stopped as s:
        report(s)
    """
    proc = start(body)
    stdout, _ = proc.communicate(timeout=20)
    notice = "SIGINT received: stopping (the run is kept; see below how to resume)"
    assert (proc.returncode, stdout) == (130, f"a line interrupted by a stop signal\n{notice}\nstopped SIGINT\n")
