"""Every console template that imports the ``csrf`` macro imports it ``with context``.

Jinja2 imports macros without the importing template's variables unless told: ``csrf()``
would then render ``value=""`` and every form using it would be refused with a 403 in a
real browser (the HTTP tests' clients read the token from another form and did not see it).
"""

from __future__ import annotations

import re
from pathlib import Path

import app.console

TEMPLATES = Path(app.console.__file__).parent / "templates"
IMPORT = re.compile(r"{%-?\s*from\s+\"_macros\.html\"\s+import\s+([^%]*?)-?%}")


def test_csrf_macro_is_imported_with_context_everywhere() -> None:
    checked = 0
    for path in sorted(TEMPLATES.glob("*.html")):
        for names in IMPORT.findall(path.read_text()):
            if re.search(r"\bcsrf\b", names):
                checked += 1
                assert names.rstrip().endswith("with context"), f"{path.name}: {names}"
    assert checked >= 5  # run, approvals, confirm, start, dead letters, schedules
