"""git's push protocol (v0/v1) spoken by packyard: ``packyard receive-pack REPO``.

* :mod:`.pktline` -- pkt-line framing with bounds (length, count), typed errors, side bands;
* :mod:`.refrules` -- git's rules for a command: ``check_refname_format``, hidden refs, deletes,
  fast-forwards, the old value;
* :mod:`.session` -- one push: the advertisement, commands and options, the pack into the ingest
  pipeline (:mod:`packyard.workers.commands.receive_pack`), the report.

See docs/receive.md.
"""
