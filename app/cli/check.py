"""``treadle check``: the determinism checker's command line (analysis in app.sdk.check)."""

from __future__ import annotations

import json
import os
import sys
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from app.sdk.check import Finding


class OutputFormat(StrEnum):
    """How findings are printed."""

    TEXT = "text"
    JSON = "json"


def check(
    modules: Annotated[
        list[str],
        typer.Argument(help="Modules to check, dotted (examples.orders) or as .py paths."),
    ],
    output: Annotated[
        OutputFormat,
        typer.Option("--output", "-o", "--format", help="text (path:line:col: CODE …) or json."),
    ] = OutputFormat.TEXT,
) -> None:
    """Find nondeterministic calls in workflow bodies and the helpers they call.

    Reports clock, randomness, sleep, file, process, network, environment and thread
    calls outside steps, as ``path:line:col: CODE message``. Exit status: 0 when clean,
    1 when there are findings, 2 when a module cannot be found or parsed. Silence one
    finding with ``# treadle: allow[TRD101]`` on its line.
    Codes: TRD101 clock, TRD102 randomness, TRD103 sleep, TRD104 file system, TRD105
    process, TRD106 network, TRD107 environment, TRD108 threading.
    """
    # Imported here, not at the top: app.sdk brings SQLAlchemy's asyncio layer, and every
    # other `treadle` command (serve, worker, token, runs …) would pay for it at start.
    from app.sdk.check import RULES, CheckError, check_module

    # Dotted names resolve from the working directory, as `treadle worker --handlers` do.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    findings: list[Finding] = []
    errors: list[str] = []
    for name in modules:
        try:
            findings.extend(check_module(name))
        except CheckError as exc:
            errors.append(str(exc))
    if output == OutputFormat.JSON:
        document = {
            "findings": [f.as_dict() for f in findings],
            "errors": errors,
            "rules": {code: rule.category for code, rule in RULES.items()},
        }
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        for finding in findings:
            typer.echo(finding.render())
        for error in errors:
            typer.secho(f"error: {error}", fg=typer.colors.RED, err=True)
        summary = f"{len(findings)} finding(s) in {len(modules)} module(s)"
        typer.echo(summary if findings else f"no findings in {len(modules)} module(s)", err=True)
    if errors:
        raise typer.Exit(2)
    if findings:
        raise typer.Exit(1)
