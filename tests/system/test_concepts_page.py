"""docs/concepts.md's table of states is `sqla_queue.job.states.STATES` as written: a row per
status, and in each column of a `State` field the value the code gives it. No database."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sqla_queue.job.states import STATES, JobStatus, State

PAGE = Path(__file__).resolve().parents[2] / "docs" / "concepts.md"
WORDS = {"yes": True, "no": False}


def states_table() -> tuple[list[str], dict[str, list[str]]]:
    """The header and the rows, by status, of the page's table whose first column is `status`."""
    lines = PAGE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| status |"))
    header = [cell.strip().strip("`") for cell in lines[start].strip("|").split("|")]
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = cells
    return header, rows


def test_the_states_table_has_one_row_per_status_and_a_column_per_boolean_field() -> None:
    header, rows = states_table()
    assert list(rows) == [status.value for status in STATES]
    booleans = [f.name for f in dataclasses.fields(State) if f.name != "unique_bit"]
    assert [name for name in header if name in booleans] == booleans, (
        f"docs/concepts.md: the states table's columns {header} must name each of {booleans}"
    )


def test_each_cell_of_the_states_table_says_what_states_py_says() -> None:
    header, rows = states_table()
    booleans = {f.name for f in dataclasses.fields(State) if f.name != "unique_bit"}
    wrong = [
        f"{status}.{name}: the page says {cell!r}, STATES says {getattr(state, name)}"
        for status, cells in rows.items()
        for state in [STATES[JobStatus(status)]]
        for name, cell in zip(header, cells, strict=True)
        if name in booleans and WORDS.get(cell) != getattr(state, name)
    ]
    assert not wrong, "docs/concepts.md disagrees with sqla_queue/job/states.py:\n" + "\n".join(
        wrong
    )
