"""Helpers of every floor: whole-file writes, one-line errors, the project's log."""
