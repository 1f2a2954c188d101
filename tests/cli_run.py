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
