"""The serve tests' server: :func:`rmfast.serve.server.serving` (real HTTP on loopback, a background thread)."""

from rmfast.serve.server import serving as running  # noqa: F401
