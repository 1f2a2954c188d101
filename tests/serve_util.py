"""A real ``rmfast serve`` app on a loopback port in a background thread, for the serve tests (real HTTP: the
clients under test open their own connections)."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(app, port: int | None = None):
    """Serve ``app`` on 127.0.0.1 until the block ends; yields its base URL."""
    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", access_log=False))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not t.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(timeout=30)
