"""Backups of repositories: the repository checksum (Gitaly's), bundles and their manifests."""
