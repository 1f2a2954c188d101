"""What the server answers when it does not score: one JSON line ``{"error": {"message", "code", ...}}`` with its status,
built from the request's fault (:class:`ApiError`, a validation error, a route or method that is not there, an
internal error), never a traceback to the client (:mod:`rmfast.serve.app`'s module doc lists the statuses)."""

from __future__ import annotations


class ApiError(Exception):
    """An error answered to the client: its status, one line, headers (Retry-After) and extra fields of its body."""

    def __init__(self, status: int, message: str, headers: dict | None = None, extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers, self.extra = int(status), message, headers or {}, extra or {}


def validation_line(exc) -> tuple[int, str]:
    """A FastAPI validation error as (status, one line naming the field): 400 for a body that is not JSON."""
    errs = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errs):
        e = next(e for e in errs if e.get("type") == "json_invalid")
        return 400, f"the body is not valid JSON ({e.get('ctx', {}).get('error', 'malformed')})"
    locs = [[p for p in x.get("loc", ()) if p != "body"] for x in errs]  # each error's field path as the client wrote it
    loc = locs[0]
    cut = next((i for i, p in enumerate(loc) if _is_type_tag(p)), None)
    if cut is not None:  # a union field: pydantic reports one error per member type, each tagged with the type
        tags = [x[cut] for x in locs if x[:cut] == loc[:cut] and len(x) > cut]
        wants = " or ".join(dict.fromkeys(_TYPE_WORDS.get(str(t), str(t)) for t in tags))
        rest = len(errs) - len(tags)
        return 422, f"{_where(loc[:cut])}: expected {wants}" + (f" (and {rest} more)" if rest > 0 else "")
    extra = [_where(x) for x, e in zip(locs, errs) if e.get("type") == "extra_forbidden"]
    if extra and errs[0].get("type") != "extra_forbidden":  # a missing field beside an unknown one: a misspelling?
        extra_words = f"; not a field: {', '.join(extra[:3])}"
    else:
        extra_words = ""
    n_more = len(errs) - 1 - (len(extra) if extra_words else 0)
    more = f" (and {n_more} more)" if n_more > 0 else ""
    return 422, f"{_where(loc)}: {errs[0].get('msg', 'invalid')}{extra_words}{more}"


#: what a union member's type tag in a validation error's location means, in a client's words
_TYPE_WORDS = {"str": "a string", "list[str]": "a list of strings", "none": "null", "int": "an integer",
               "float": "a number", "bool": "true or false", "list[nullable[str]]": "a list of strings (or nulls)",
               "list[any]": "a list", "list[dict[any,any]]": "a list of chat messages (objects)"}


def _is_type_tag(p) -> bool:
    """Whether a location element names a union member's type (``str``, ``list[str]``, ``none``), not a field or index."""
    return isinstance(p, str) and (p in _TYPE_WORDS or "[" in p)


def _where(loc) -> str:
    """A location as the field path the client wrote: ``conversations[0].responses``."""
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "body"


def check_unicode(value, where: str = "body") -> None:
    """422 naming the first string that is not valid Unicode (JSON's escapes can carry a lone surrogate, which no
    tokenizer encodes), walking lists and dicts; the routes call it on their parsed body.

    >>> check_unicode({"query": ["ok", "bad \\ud800"]})
    Traceback (most recent call last):
    ...
    rmfast.serve.errors.ApiError: body.query[1]: not valid Unicode (a lone surrogate at character 4); send UTF-8 text
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ApiError(422, f"{where}: not valid Unicode (a lone surrogate at character {e.start}); send UTF-8 "
                                "text") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            check_unicode(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for k, v in enumerate(value):
            check_unicode(v, f"{where}[{k}]")


def json_type(content_type: str) -> bool:
    """Whether FastAPI reads a body of this type as JSON: application/json or application/<anything>+json (text/json is
    not: it had been a 422 on 'body' where the 415's hint belongs).

    >>> [json_type(t) for t in ("application/json; charset=utf-8", "application/vnd.api+json", "text/json", "")]
    [True, True, False, False]
    """
    kind = content_type.split(";")[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def key_refusal(key: str | None, headers) -> ApiError | None:
    """The 401 of a request whose ``headers`` lack the API key ``key`` (compared in constant time), or None (the key
    given, or no key set)."""
    import hmac

    if key is None:
        return None
    got = headers.get("authorization", "")
    token = got[7:].strip() if got[:7].lower() == "bearer " else ""
    if not hmac.compare_digest(token.encode(), key.encode()):
        return ApiError(401, "no API key or a wrong one: send 'Authorization: Bearer <key>'")
    return None


def error_response(status: int, message: str, headers: dict | None = None, extra: dict | None = None):
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "code": status, **(extra or {})}}, status, headers)


def internal_line(exc: Exception) -> str:
    """A 500's one line: the exception's type and first line (never a traceback to the client)."""
    first = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"internal error: {type(exc).__name__}: {first}"


def gone_mid_body(exc) -> bool:
    """Whether FastAPI's 400 "error parsing the body" was the client going away while it sent the body."""
    from starlette.requests import ClientDisconnect

    return exc.status_code == 400 and isinstance(exc.__cause__, ClientDisconnect)


def http_line(app, request, exc) -> str:
    """One line for an HTTP error FastAPI raised itself, naming what the server does have."""
    routes = sorted(f"{m} {r.path}" for r in app.routes for m in getattr(r, "methods", ()) if m != "HEAD")
    if exc.status_code == 404:
        return f"no route {request.method} {request.url.path}; the routes: {', '.join(routes)}"
    if exc.status_code == 405:
        return f"{request.url.path} does not take {request.method}; it takes " + ", ".join(
            r.split()[0] for r in routes if r.split()[1] == request.url.path)
    if gone_mid_body(exc):  # not a bad body (nobody reads the answer): a 499 in the log and the metrics
        return "the client disconnected while sending its body"
    if exc.status_code == 400 and "parsing the body" in str(exc.detail):
        if isinstance(exc.__cause__, RecursionError):  # valid text, nested past the parser's depth
            return "the body's JSON is nested too deeply to read; send the fields as the route documents them"
        if isinstance(exc.__cause__, ValueError) and "digits" in str(exc.__cause__):  # Python's int-digit limit
            import sys

            return (f"the body holds a number too long to read (over {sys.get_int_max_str_digits():,} digits); send "
                    "the fields as documented")
        return "the body could not be read as JSON (is it UTF-8?)"
    return str(exc.detail).splitlines()[0][:300] if exc.detail else f"HTTP {exc.status_code}"
