"""Backups of repositories: the repository checksum (Gitaly's), bundles and their manifests, restores and retention.

A layer above the store's core and :mod:`packyard.store.maintenance` (it writes bundles with the repack's walk and
write plan); neither imports it (tests/store/test_layers.py). docs/backups.md describes the format.
"""
