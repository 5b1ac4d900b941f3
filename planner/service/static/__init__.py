"""The diagnostics page (package data)."""
