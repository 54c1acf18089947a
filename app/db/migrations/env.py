"""Alembic's environment: always run by `app.db.migrate` on a connection it passes in.

`tokengate db upgrade` (and `serve`, for an empty database) hold the schema lock and hand
their connection over in `config.attributes["connection"]`; there is no alembic.ini and no
URL here, so the `alembic` command line is not a way in.
"""

from __future__ import annotations

from alembic import context

from app.db.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise SystemExit("run migrations with `tokengate db upgrade`, not the alembic command")
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # ALTER through table copies
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
