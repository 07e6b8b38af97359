"""reconcile_jobs: mark jobs whose message vanished LOST, put stranded deliveries back (workers/reconcile.py).

Not a PackyardTask: it acts on no repository and records no job row of its own (beat runs it
every PACKYARD_LOST_AFTER / 2 seconds; its rows would crowd out the jobs in ``packyard status``).
"""
from __future__ import annotations

from typing import Any

from packyard.workers.app import app

#: Beat is not interactive: give busy workers time to answer (see workers/reconcile.py).
BEAT_INSPECT_TIMEOUT = 5.0


@app.task(name="packyard.reconcile_jobs", ignore_result=True, acks_late=False)
def reconcile_jobs() -> dict[str, Any]:
    """One reconciler pass; its report is logged (``reconcile.pass``) and returned."""
    from packyard.workers import logs as plog
    from packyard.workers.reconcile import reconcile
    from packyard.workers.settings import get_settings

    report = reconcile(get_settings(), app, inspect_timeout=BEAT_INSPECT_TIMEOUT)
    plog.get_logger("packyard.reconcile").info("reconcile.pass", summary=report.summary(), lost=report.lost,
                                               restored=report.restored)
    return {"lost": report.lost, "restored": report.restored, "pending": report.pending}
