"""Database URLs: a mistake in one is one line that names the fix and shows no password."""

from __future__ import annotations

import pytest

from sqla_queue import ConfigurationError
from sqla_queue.database import normalize_url


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
