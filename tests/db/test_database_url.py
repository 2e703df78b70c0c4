"""Database URLs: a mistake in one is one line that names the fix and shows no password."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from sqlalchemy.engine import make_url

from sqla_queue import (
    ConfigurationError,
)
from sqla_queue.cli import main
from sqla_queue.db.database import normalize_url


def test_a_password_with_an_unencoded_at_sign_is_named_as_the_likely_cause() -> None:
    # SQLAlchemy reads "p@ss:w0rd@db" as the password "p", the host "ss", the port "w0rd@db".
    with pytest.raises(ConfigurationError) as raised:
        normalize_url("postgresql://app:p@ss:w0rd@db.internal/app")
    message = str(raised.value)
    assert "percent-encode" in message
    assert "w0rd" not in message
    assert "\n" not in message


def test_an_encoded_password_is_kept_as_it_is() -> None:
    url = normalize_url("postgresql://app:p%40ss%3Aw0rd@db.internal:5432/app")
    assert url == "postgresql+psycopg://app:p%40ss%3Aw0rd@db.internal:5432/app"


@pytest.mark.parametrize("port", ["abc", "99999"])
def test_a_bad_port_in_the_url_is_a_one_line_error(database_url: str, port: str) -> None:
    url = make_url(database_url).set(password="s3cret-pw").render_as_string(False)
    bad = url.replace("127.0.0.1:5432", f"127.0.0.1:{port}")
    assert bad != url
    result = CliRunner().invoke(main, ["stats", "--database-url", bad])
    assert result.exit_code == 1
    assert "port" in result.output
    assert "Traceback" not in result.output
    assert "s3cret-pw" not in result.output
    assert len(result.output.strip().splitlines()) == 1
