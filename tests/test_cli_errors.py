"""Bad values on the command line: each a one-line error naming the problem, no traceback."""

from __future__ import annotations

import pytest
from apps.support import invoke_cli


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("enqueue", "t", "--args", '{"x": NaN}'), "NaN is not JSON"),
        (("enqueue", "t", "--delay", "99999999999999999999"), "from 0 to 3155760000 s"),
        (("enqueue", "t", "--delay", "1e20"), "'1e20' is not a duration"),
        (("migrate", "--revision", "bogus"), "migration failed"),
    ],
)
def test_cli_bad_values_are_one_line_errors(
    database_url: str, args: tuple[str, ...], fragment: str
) -> None:
    result = invoke_cli(database_url, *args)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert fragment in result.output
