"""Create the example apps' own tables on SQLA_QUEUE_DATABASE_URL (an application migrates).

python -m examples.create_tables      # after `sqla-queue migrate`, before starting an app
"""

from __future__ import annotations

import os

from sqlalchemy import create_engine

from sqla_queue.db.database import URL_ENV_VAR, normalize_url

from .fastapi_app.models import Base as FastAPIBase
from .flask_app.app import Base as FlaskBase


def main() -> None:
    engine = create_engine(normalize_url(os.environ[URL_ENV_VAR]))
    try:
        for base in (FastAPIBase, FlaskBase):
            base.metadata.create_all(engine)
    finally:
        engine.dispose()


if __name__ == "__main__":
    main()
