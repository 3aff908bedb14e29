"""The live gate: run the candidate until the verdict is decided (``gate --run``)."""
