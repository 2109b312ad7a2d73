"""Which frames a tenant's traceback keeps and how their paths show (app/core/tracebacks.py)."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import httpx
import pytest

from app.core.tracebacks import full_traceback, user_traceback

HERE = "tests/unit/test_tracebacks.py"
FRAME = re.compile(r'^  File "([^"]*)", line \d+, in (\S+)$', re.MULTILINE)
FRAME_IN_GROUP = re.compile(r'File "([^"]*)", line \d+')


def frames(text: str) -> list[tuple[str, str]]:
    """The ``(file, function)`` of every frame line."""
    return FRAME.findall(text)


def caught(fn: object, *args: object) -> BaseException:
    """The exception ``fn(*args)`` raises (its traceback attached)."""
    assert callable(fn)
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001 - whatever it is, it is the subject
        return exc
    raise AssertionError("did not raise")


def helper(path: str) -> None:
    raise FileNotFoundError(f"no such file: {path}")


async def async_step(path: str) -> None:
    helper(path)


def test_asyncio_plumbing_is_dropped_and_paths_are_relative() -> None:
    """``asyncio.run`` adds stdlib frames around the user's: only the user's remain."""
    exc = caught(asyncio.run, async_step("/srv/a.json"))
    full = full_traceback(exc)
    assert "asyncio" in full and str(Path.cwd() / HERE) in full  # the frames exist...
    shown = user_traceback(exc)
    assert frames(shown) == [(HERE, "caught"), (HERE, "async_step"), (HERE, "helper")], shown
    # ...the message is the user's text, absolute path included.
    assert shown.endswith("FileNotFoundError: no such file: /srv/a.json\n"), shown


def test_a_third_party_librarys_frames_stay_relative_to_site_packages() -> None:
    """Code the user called is where the error is: kept, shown as ``package/module.py``."""
    with httpx.Client() as client:
        exc = caught(client.get, "ftp://example.invalid/x")
    shown = user_traceback(exc)
    files = [file for file, _ in frames(shown)]
    assert (HERE, "caught") in frames(shown), shown
    assert any(f.startswith("httpx/") for f in files), shown
    assert not any(f.startswith("/") for f in files), shown


def test_a_file_outside_every_root_shows_its_name_and_exec_code_its_pseudo_file() -> None:
    """No absolute path even for a file under no known root; ``<string>`` stays."""
    namespace: dict[str, object] = {}
    outside = "/opt/elsewhere/handlers/charge.py"
    exec(compile("def charge():\n    raise KeyError('card')\n", outside, "exec"), namespace)
    exec(compile("def run(f):\n    f()\n", "<string>", "exec"), namespace)
    shown = user_traceback(caught(namespace["run"], namespace["charge"]))
    assert frames(shown) == [(HERE, "caught"), ("<string>", "run"), ("charge.py", "charge")]
    assert "/opt/" not in shown


def test_treadles_own_frames_are_dropped() -> None:
    """A frame of a file inside the ``app`` package is Treadle's: never shown."""
    from app.core import json

    exc = caught(json.loads, "{not json")
    assert "app/core/json.py" in full_traceback(exc)
    assert frames(user_traceback(exc)) == [(HERE, "caught")], user_traceback(exc)


def chain() -> None:
    try:
        helper("/srv/b.json")
    except FileNotFoundError as exc:
        raise RuntimeError("wrapped") from exc


def context() -> None:
    try:
        helper("/srv/c.json")
    except FileNotFoundError:
        empty: dict[str, int] = {}
        empty["missing"]  # an error while handling another


def test_cause_and_context_chains_are_filtered_alike() -> None:
    """Each exception of the chain keeps its user frames and Python's linking sentence."""
    shown = user_traceback(caught(chain))
    assert "The above exception was the direct cause of the following exception" in shown
    assert frames(shown) == [
        (HERE, "chain"),
        (HERE, "helper"),
        (HERE, "caught"),
        (HERE, "chain"),
    ], shown
    shown = user_traceback(caught(context))
    assert "During handling of the above exception, another exception occurred" in shown
    assert "KeyError: 'missing'" in shown


def group() -> None:
    errors: list[Exception] = []
    for path in ("/srv/d.json", "/srv/e.json"):
        try:
            asyncio.run(async_step(path))
        except FileNotFoundError as exc:
            errors.append(exc)
    raise ExceptionGroup("two failed", errors)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception groups")
def test_exception_group_members_are_filtered() -> None:
    """A TaskGroup's ``ExceptionGroup``: every member's stdlib frames are dropped too."""
    exc = caught(group)
    assert "asyncio" in full_traceback(exc)
    shown = user_traceback(exc)
    assert str(Path.cwd()) not in shown, shown
    assert not any("asyncio" in f for f in FRAME_IN_GROUP.findall(shown)), shown
    assert shown.count(f'File "{HERE}", line') >= 5, shown
    assert "no such file: /srv/e.json" in shown
