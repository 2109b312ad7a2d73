"""The installed Treadle version (``treadle --version``, the client's ``User-Agent``)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def treadle_version() -> str:
    """The version of the installed ``treadle`` distribution (pyproject ``version``).

    Returns ``"0+unknown"`` when the code runs from a tree that was never installed.
    """
    try:
        return version("treadle")
    except PackageNotFoundError:  # pragma: no cover - a checkout without `uv sync`
        return "0+unknown"
