"""Pure statistics on runs and numbers (numpy, scipy, river): no I/O, no clocks."""

from __future__ import annotations
