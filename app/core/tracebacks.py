"""Tracebacks a tenant may read: the user's frames only, never a path of the worker's disk.

A run's and a step's error are read by every client of the tenant (the API, the console,
the CLI, dead letters), so its traceback must not show how Treadle or the machine it runs
on is built. :func:`user_traceback` formats an exception the way Python does (the same
``File "…", line N, in name`` lines, the same cause and context chain, exception groups
included) with two changes (docs/adr/0025-user-frames-only.md):

- **Frames are filtered by where their file lives**, not by module name: a frame of a
  file inside Treadle's own ``app`` package, of the Python standard library (``asyncio``'s
  task plumbing, ``concurrent.futures``, ``threading``; found by ``sysconfig``'s
  ``stdlib`` and ``platstdlib`` paths, minus any site directory inside them) or of a
  frozen module (``<frozen importlib._bootstrap>``) is dropped. Everything else is kept:
  handler code in the working directory, a team's own installed package in
  ``site-packages``, and the third-party libraries that code called (an HTTP client that
  raised is where the error is).
- **Paths are relative**: a kept frame's file is shown relative to the deepest of the
  working directory and the ``sys.path`` entries it lies under (``examples/orders.py``,
  ``httpx/_client.py``), else by its bare file name. Pseudo-files (``<string>``) stay.

The exception's type and message are not touched: a message holding an absolute path is
the user's own text. :func:`full_traceback` is Python's unfiltered format, for the worker's
log and for deployments that set ``TREADLE_ERROR_TRACEBACKS=full``.
"""

from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
import traceback
from pathlib import PurePath

# Treadle's own package: app/core/tracebacks.py -> app/.
_OWN_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def full_traceback(exc: BaseException) -> str:
    """Python's own formatting of ``exc`` with its chain (every frame, absolute paths)."""
    return "".join(traceback.format_exception(exc))


def user_traceback(exc: BaseException) -> str:
    """``exc`` formatted like :func:`full_traceback`, with only the user's frames.

    See the module docstring for which frames are kept and how their paths are shown.
    Every exception of the chain (``raise … from …``, an exception raised while handling
    another, the members of an exception group) is filtered alike; an exception none of
    whose frames is the user's shows only its ``Type: message`` line.

    Returns:
        The text, ending in a line break, as :func:`traceback.format_exception` does.
    """
    formatted = traceback.TracebackException.from_exception(exc, capture_locals=False)
    seen: set[int] = set()
    pending = [formatted]
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        node.stack = traceback.StackSummary.from_list(
            [
                traceback.FrameSummary(
                    _shown_path(frame.filename),
                    frame.lineno,
                    frame.name,
                    lookup_line=False,
                    line=frame.line,
                )
                for frame in node.stack
                if not _is_internal(frame.filename)
            ]
        )
        pending.extend(n for n in (node.__cause__, node.__context__) if n is not None)
        pending.extend(getattr(node, "exceptions", None) or ())
    return "".join(formatted.format())


def _is_internal(filename: str) -> bool:
    """True for a frame of Treadle's own package, the standard library or a frozen module."""
    if filename.startswith("<frozen "):
        return True
    if filename.startswith("<"):
        return False  # <string>, <stdin>: the user's own exec'd code
    path = os.path.abspath(filename)
    if _under(path, _OWN_PACKAGE):
        return True
    return any(_under(path, d) for d in _stdlib_dirs()) and not any(
        _under(path, d) for d in _site_dirs()
    )


def _shown_path(filename: str) -> str:
    """``filename`` relative to its deepest known root, or its bare name; never absolute."""
    if filename.startswith("<"):
        return filename
    path = os.path.abspath(filename)
    roots = [os.getcwd(), *(os.path.abspath(p) for p in sys.path if p)]
    deepest = max((r for r in roots if _under(path, r)), key=len, default=None)
    if deepest is None:
        return os.path.basename(path)
    return PurePath(os.path.relpath(path, deepest)).as_posix()


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


@functools.cache
def _stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple({os.path.abspath(paths[k]) for k in ("stdlib", "platstdlib") if k in paths})


@functools.cache
def _site_dirs() -> tuple[str, ...]:
    # Where installed packages live (a venv's, the system's, the user's): a distribution
    # may put site-packages inside the stdlib directory (/usr/lib/python3.X/site-packages),
    # and what is installed there is not the standard library.
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("purelib", "platlib") if k in paths}
    dirs.update(getattr(site, "getsitepackages", list)())
    user_site = getattr(site, "getusersitepackages", lambda: None)()
    if isinstance(user_site, str):
        dirs.add(user_site)
    dirs.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    return tuple(os.path.abspath(d) for d in dirs)
