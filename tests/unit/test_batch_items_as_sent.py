"""``submit-batch``: items that are not objects reach the API; bad lines are named.

A black-box session found the CLI crashing (a traceback) on a file item that is not an
object, where the API answers that item alone with 422; and a JSON-lines file with a bad
third line reported "line 1 column 1".
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from app.cli.runs import read_batch_file
from app.client import _http


def test_items_that_are_not_objects_are_sent_as_they_are() -> None:
    call = _http.submit_batch_call([{"workflow": "w", "input": {}}, "notanobject", 7, None])
    assert call.body == {"runs": [{"workflow": "w", "input": {}}, "notanobject", 7, None]}


def test_a_bad_json_line_is_named_by_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text('{"workflow": "w"}\n\n{"workflow": "w"}\n{"workflow": \n')
    with pytest.raises(typer.Exit) as exited:
        read_batch_file(str(path))
    assert exited.value.exit_code == 2
    assert "JSON lines: line 4: " in capsys.readouterr().err


def test_a_file_of_one_string_is_one_item(tmp_path: Path) -> None:
    path = tmp_path / "runs.json"
    path.write_text('"str"\n')
    assert read_batch_file(str(path)) == ["str"]
