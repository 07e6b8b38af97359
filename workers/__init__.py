"""packyard workers: Celery app, tasks, locks, job records, logging and the ``packyard`` CLI.

``store/`` is the engine (plain Python); everything that needs Redis, Celery or a
database lives here.
"""
