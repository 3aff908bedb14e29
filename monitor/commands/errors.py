"""Errors users see on the command line."""

from __future__ import annotations


class UsageError(Exception):
    """A user mistake: printed as ``assaywatch: error: <message>`` with exit code 3."""
