"""The request body's size cap (``--max-body-mb``): a body past it gets one 413 line of type ``body_too_large``, read
by nothing but a byte count. Without it a client could send a body of any size, held whole and then parsed into
Python objects several times its size, before any field was checked (a 2 GB body: gigabytes of the server's memory).

A body whose Content-Length says it is too large is refused before the route sees it; one sent in chunks is counted
as it comes (:func:`capped`). Either way the rest of the body, up to :data:`DRAIN_MAX` past the cap, is read and
dropped before the answer, so that a client still sending it (one that does not wait for ``100 Continue``) reads the
413 and not a reset connection; past that (a declared 10 GB) the answer closes the connection at once, as it does
for a client that asked ``Expect: 100-continue`` (curl, past 1 MB) and never sends its body (kept open, the
connection's next request had been read as that body, and hung)."""

from __future__ import annotations

#: the default cap in MiB (``--max-body-mb``): ~16M tokens of JSON text, a GRPO step of 4096 samples of ~4k
#: tokens; TGI and TEI cap theirs at 2 MB
DEFAULT_MB = 64
#: bytes past the cap read and dropped before a 413 (a client still sending reads the answer); beyond, it is closed
DRAIN_MAX = 64 << 20


class PastCap(Exception):
    """Raised from the counted ``receive`` once a chunked body passed the cap (its rest read and dropped)."""


def content_length(scope) -> int | None:
    """The request's Content-Length, or None where it sent none (chunked) or one that is not a number."""
    for k, v in scope.get("headers", ()):
        if k == b"content-length":
            try:
                return int(v)
            except ValueError:
                return None
    return None


def expects_continue(scope) -> bool:
    """Whether the client waits for ``100 Continue`` before it sends its body (curl does past 1 MB)."""
    return any(k == b"expect" and v.lower() == b"100-continue" for k, v in scope.get("headers", ()))


async def drain(receive, most: int = DRAIN_MAX) -> bool:
    """Read the rest of the body and drop it (a client still sending it then reads the answer), at most ``most``
    bytes; whether it was all read (else the answer closes the connection)."""
    seen = 0
    while True:
        m = await receive()
        if m["type"] != "http.request" or not m.get("more_body", False):
            return True
        seen += len(m.get("body", b""))
        if seen > most:
            return False


def capped(receive, limit: int, arrived=None):
    """``receive`` that counts the body's bytes and raises :class:`PastCap` (the rest drained) past ``limit``;
    ``arrived()`` is called once the whole body has come (the server's drain counts the request from then on)."""
    seen = 0

    async def counted():
        nonlocal seen
        m = await receive()
        if m["type"] == "http.request":
            seen += len(m.get("body", b""))
            if seen > limit:
                if m.get("more_body", False):
                    await drain(receive)  # (the rest past DRAIN_MAX: uvicorn closes a connection it did not read)
                raise PastCap(seen)
            if not m.get("more_body", False) and arrived is not None:
                arrived()
        return m

    return counted


def too_large(limit: int, size: int | None = None) -> tuple[str, dict]:
    """The 413's line and its body's extra fields (``type``, ``max_body_bytes``: a client splits by them).

    >>> too_large(64 << 20, 70_000_000)[0]
    'the body is 70,000,000 bytes, over --max-body-mb 64 (67,108,864 bytes); send fewer samples a request, or raise --max-body-mb'
    """
    was = f"is {size:,} bytes" if size is not None else "passed the cap"
    return (f"the body {was}, over --max-body-mb {limit / (1 << 20):g} ({limit:,} bytes); send fewer samples a "
            "request, or raise --max-body-mb", {"type": "body_too_large", "max_body_bytes": limit})
