"""Bundled demo data (package data): see README.md."""
