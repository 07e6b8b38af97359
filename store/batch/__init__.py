"""Batch writes of new objects: loose files (:mod:`.loose`) or one pack (:mod:`.pack`)."""
