"""Plain work functions behind the tasks (no Celery): ids/paths/params + ``progress`` in, ``{"counters": …}`` out."""
