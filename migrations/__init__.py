"""Alembic migrations of the packyard job records (run them with ``packyard migrate``)."""
