"""Print the OpenAPI document: ``python -m app.api.openapi > openapi/openapi.json``."""

from __future__ import annotations

import json
import sys

from app.api.app import openapi_document


def render() -> str:
    """The committed form of the spec: sorted keys, two-space indent, trailing newline."""
    return json.dumps(openapi_document(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
