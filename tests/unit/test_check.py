"""The determinism checker (app.sdk.check) and ``treadle check``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli.main import app
from app.sdk.check import RULES, CheckError, check_module, check_source

HEADER = """\
from app.sdk import WorkflowContext, workflow
"""


def codes(body: str, prelude: str = "") -> list[tuple[str, int]]:
    """(code, line) of each finding; line 1 is the first line of ``prelude``."""
    source = textwrap.dedent(prelude) + HEADER + textwrap.dedent(body)
    return [(f.code, f.line) for f in check_source(source, "m.py", "pkg.m")]


@pytest.mark.parametrize(
    ("imports", "call", "code"),
    [
        ("import time", "time.time()", "TRD101"),
        ("import time", "time.monotonic()", "TRD101"),
        ("import datetime", "datetime.datetime.now()", "TRD101"),
        ("import datetime", "datetime.datetime.utcnow()", "TRD101"),
        ("import datetime", "datetime.date.today()", "TRD101"),
        ("import random", "random.choice([1, 2])", "TRD102"),
        ("import uuid", "uuid.uuid4()", "TRD102"),
        ("import uuid", "uuid.uuid1()", "TRD102"),
        ("import secrets", "secrets.token_hex(8)", "TRD102"),
        ("import os", "os.urandom(8)", "TRD102"),
        ("import time", "time.sleep(1)", "TRD103"),
        ("import asyncio", "asyncio.sleep(1)", "TRD103"),
        ("import io", "io.open('f')", "TRD104"),
        ("import os", "os.listdir('.')", "TRD104"),
        ("import os", "os.path.exists('f')", "TRD104"),
        ("import pathlib", "pathlib.Path('f').write_text('x')", "TRD104"),
        ("import shutil", "shutil.copy('a', 'b')", "TRD104"),
        ("import subprocess", "subprocess.run(['ls'])", "TRD105"),
        ("import os", "os.system('ls')", "TRD105"),
        ("import asyncio", "asyncio.create_subprocess_exec('ls')", "TRD105"),
        ("import httpx", "httpx.get('http://x')", "TRD106"),
        ("import requests", "requests.post('http://x')", "TRD106"),
        ("import urllib.request", "urllib.request.urlopen('http://x')", "TRD106"),
        ("import socket", "socket.create_connection(('x', 1))", "TRD106"),
        ("import aiohttp", "aiohttp.ClientSession()", "TRD106"),
        ("import os", "os.getenv('HOME')", "TRD107"),
        ("import os", "os.environ['HOME']", "TRD107"),
        ("import os", "os.environ.get('HOME')", "TRD107"),
        ("import threading", "threading.Thread(target=print)", "TRD108"),
        ("import asyncio", "asyncio.to_thread(print)", "TRD108"),
        ("import concurrent.futures", "concurrent.futures.ThreadPoolExecutor()", "TRD108"),
    ],
)
def test_each_category_is_found_on_its_line(imports: str, call: str, code: str) -> None:
    body = f"""
    @workflow("w")
    async def w(ctx: WorkflowContext, inp: object) -> None:
        x = 1
        y = {call}
    """
    # imports: line 1, header: line 2, blank: 3, decorator: 4, def: 5, x: 6, call: 7
    assert codes(body, imports + "\n") == [(code, 7)]


def test_builtin_open_is_found_unless_shadowed() -> None:
    body = """
    @workflow("w")
    async def w(ctx: WorkflowContext, inp: object) -> None:
        open("f")

    @workflow("v")
    async def v(ctx: WorkflowContext, open: object) -> None:
        open("f")
    """
    assert codes(body) == [("TRD104", 5)]


def test_import_aliases_are_resolved() -> None:
    prelude = """\
    from time import time as t
    import datetime as dt
    from datetime import datetime, date
    import time as clock
    from subprocess import run as sh
    from os import environ, getenv as ge
    from random import random as rnd
    """
    body = """
    @workflow("w")
    async def w(ctx: WorkflowContext, inp: object) -> None:
        t()
        dt.datetime.now()
        datetime.utcnow()
        date.today()
        clock.sleep(1)
        sh(["ls"])
        environ["X"]
        ge("Y")
        rnd()
        datetime.fromisoformat("2030-01-01")
        dt.timedelta(seconds=1)
    """
    assert codes(body, prelude) == [
        ("TRD101", 12),
        ("TRD101", 13),
        ("TRD101", 14),
        ("TRD101", 15),
        ("TRD103", 16),
        ("TRD105", 17),
        ("TRD107", 18),
        ("TRD107", 19),
        ("TRD102", 20),
    ]


def test_helpers_are_checked_transitively_and_only_when_reached() -> None:
    prelude = """\
    import random
    import time
    """
    body = """
    def deepest() -> float:
        return time.time()

    def helper() -> float:
        return deepest() + 1

    async def ahelper(ctx: WorkflowContext) -> None:
        await ctx.sleep(1)
        time.sleep(1)

    def unused() -> float:
        return random.random()

    @workflow("w")
    async def w(ctx: WorkflowContext, inp: object) -> None:
        helper()
        await ahelper(ctx)

        def nested() -> int:
            return random.randint(1, 6)

        nested()
    """
    found = check_source(textwrap.dedent(prelude) + HEADER + textwrap.dedent(body), "m.py")
    assert [(f.code, f.line, f.function) for f in found] == [
        ("TRD101", 6, "deepest"),
        ("TRD103", 13, "ahelper"),
        ("TRD102", 24, "nested"),
    ]
    assert "in deepest(), which it calls" in found[0].message


def test_step_functions_lambdas_and_compensations_are_not_checked() -> None:
    prelude = """\
    import random
    import time
    """
    body = """
    def draw() -> float:
        return random.random()

    def undo(x: float) -> None:
        time.sleep(1)

    def notify(decision: object) -> None:
        time.sleep(1)

    def write(tx: object) -> None:
        open("f")

    @workflow("w")
    async def w(ctx: WorkflowContext, inp: object) -> None:
        await ctx.step(draw, compensate=undo)
        await ctx.step(lambda: random.random(), name="r", compensate=lambda x: time.sleep(x))
        await ctx.transaction(write)
        await ctx.approval("boss", on_reject=notify)

        def in_step() -> float:
            return time.time()

        await ctx.step(in_step)
        await ctx.step(draw, time.time())
    """
    # Only the argument evaluated in the body itself is found.
    assert codes(body, prelude) == [("TRD101", 28)]


def test_functions_that_are_not_workflows_are_ignored() -> None:
    body = """
    import time

    def plain() -> float:
        return time.time()

    async def not_a_workflow(ctx: WorkflowContext, inp: object) -> None:
        time.sleep(1)
    """
    assert codes(body) == []


def test_decorator_spellings() -> None:
    source = textwrap.dedent(
        """\
        import time
        import app.sdk
        from app import sdk
        from app.sdk.workflow import workflow as wf

        @app.sdk.workflow("a")
        async def a(ctx, inp): time.time()

        @sdk.workflow("b", version=2)
        async def b(ctx, inp): time.time()

        @wf("c")
        async def c(ctx, inp): time.time()
        """
    )
    assert [f.workflow for f in check_source(source)] == ["a", "b", "c"]


def test_line_suppression_names_the_codes_it_allows() -> None:
    prelude = """\
    import time
    import uuid
    """
    body = """
    @workflow("w")
    async def w(ctx: WorkflowContext, inp: object) -> None:
        time.time()  # treadle: allow[TRD101]
        time.time()  # treadle: allow[TRD102]
        x = (time.time(), uuid.uuid4())  # treadle: allow[TRD101, TRD102]
        uuid.uuid4()  # noqa  (not ours: still reported)
    """
    assert codes(body, prelude) == [("TRD101", 8), ("TRD102", 10)]


def test_findings_render_with_columns_and_a_replacement() -> None:
    source = HEADER + textwrap.dedent(
        """
        import datetime

        @workflow("w")
        async def w(ctx: WorkflowContext, inp: object) -> None:
            when = datetime.datetime.now()
        """
    )
    (finding,) = check_source(source, "flows.py")
    assert finding.render() == (
        "flows.py:7:12: TRD101 clock: `datetime.datetime.now` in workflow 'w'; "
        "use `await ctx.now()` (journaled database time)"
    )
    assert finding.category == RULES["TRD101"].category == "clock"


def test_rules_name_their_deterministic_replacement() -> None:
    assert "ctx.now()" in RULES["TRD101"].replacement
    assert "ctx.uuid()" in RULES["TRD102"].replacement
    assert "ctx.random()" in RULES["TRD102"].replacement
    assert "ctx.sleep(" in RULES["TRD103"].replacement
    for code in ("TRD104", "TRD105", "TRD106", "TRD108"):
        assert "ctx.step(" in RULES[code].replacement


@pytest.mark.parametrize(
    "path", sorted(p for p in Path("examples").glob("*.py") if p.name != "__init__.py")
)
def test_no_false_positive_on_the_examples(path: Path) -> None:
    assert check_module(f"examples.{path.stem}") == []


def test_unknown_or_broken_modules_are_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckError, match="no such Python module"):
        check_module("examples.does_not_exist")
    broken = tmp_path / "broken.py"
    broken.write_text("def (:\n")
    with pytest.raises(CheckError, match="cannot parse"):
        check_module(str(broken))


def test_cli_exit_codes_and_json(tmp_path: Path) -> None:
    bad = tmp_path / "flows.py"
    bad.write_text(
        HEADER
        + textwrap.dedent(
            """
            import random

            @workflow("w")
            async def w(ctx: WorkflowContext, inp: object) -> None:
                random.random()
            """
        )
    )
    runner = CliRunner()
    clean = runner.invoke(app, ["check", "examples.orders", "examples.onboarding"])
    assert clean.exit_code == 0, clean.output

    text = runner.invoke(app, ["check", str(bad)])
    assert text.exit_code == 1
    assert f"{bad}:7:5: TRD102 randomness: `random.random`" in text.stdout

    as_json = runner.invoke(app, ["check", str(bad), "--format", "json"])
    assert as_json.exit_code == 1
    document = json.loads(as_json.stdout)
    assert [(f["code"], f["line"], f["column"]) for f in document["findings"]] == [("TRD102", 7, 5)]
    assert document["errors"] == []

    missing = runner.invoke(app, ["check", "examples.nope"])
    assert missing.exit_code == 2
