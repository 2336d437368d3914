"""Store URLs as they are shown: one redactor masks a password wherever it is written."""

from __future__ import annotations

import pytest

import perdure
from perdure.stores import redact_url


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://ann:s3cret@db:5432/agents", "postgresql://ann:***@db:5432/agents"),
    ("postgresql://ann:p%40ss@db/agents?sslmode=require",
     "postgresql://ann:***@db/agents?sslmode=require"),
    ("postgresql://:s3cret@db/agents", "postgresql://:***@db/agents"),
    ("postgresql://ann@db/agents", "postgresql://ann@db/agents"),
    ("host=db password=s3cret dbname=agents", "host=db password=*** dbname=agents"),
    ("host=db password = 'two words' dbname=agents", "host=db password = *** dbname=agents"),
    ("host=db sslpassword=x dbname=agents", "host=db sslpassword=x dbname=agents"),
    ("sqlite:///agents.db", "sqlite:///agents.db"),
    ("memory://tests", "memory://tests"),
])
def test_a_password_is_masked_and_nothing_else_changes(url: str, shown: str) -> None:
    """A URL's password, or a libpq keyword string's ``password``, shows as ``***``."""
    assert redact_url(url) == shown


def test_an_app_shows_its_store_url_masked_before_opening_it() -> None:
    """``App.store_url`` goes through the same redactor (the store is not opened)."""
    app = perdure.App(store="postgresql://ann:s3cret@127.0.0.1:1/agents")
    assert app.store_url == "postgresql://ann:***@127.0.0.1:1/agents"
