"""Running the CLI in-process from tests: its exit code and output, and the one-line error rule."""

from rmfast.cli import main


def run(argv, capsys):
    """``rmfast ARGV`` in this process: (exit code, stdout, stderr)."""
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def one_line_error(rc, err):
    """Bad input's contract: exit 2, exactly one ``rmfast: error`` line, no traceback."""
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("rmfast: error")]
    return rc == 2 and len(lines) == 1 and "Traceback" not in err


def interrupt_scoring_at(monkeypatch, call: int):
    """Make the engine's ``call``-th batch raise KeyboardInterrupt (Ctrl-C mid-scan: the checkpoint stays);
    returns the function that puts the real scoring back (for the resume)."""
    from rmfast.fast.engine import Engine

    real, calls = Engine.score, {"n": 0}

    def interrupted(self, responses, *a, **kw):
        calls["n"] += 1
        if calls["n"] == call:
            raise KeyboardInterrupt
        return real(self, responses, *a, **kw)

    monkeypatch.setattr(Engine, "score", interrupted)
    return lambda: monkeypatch.setattr(Engine, "score", real)


def kill_9_when(proc, ready, timeout: float, poll: float = 0.01) -> None:
    """SIGKILL ``proc`` (a ``subprocess.Popen``) as soon as ``ready()`` is true: the kill -9 harness of
    the sweep and trust tests. Fails with the child's stderr if it ended first; never leaves it running."""
    import os
    import signal
    import time

    try:
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None and not ready():
            time.sleep(poll)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL

