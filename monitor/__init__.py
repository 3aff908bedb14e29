"""The monitor service, the offline gate and replay, and the command line."""

from __future__ import annotations
