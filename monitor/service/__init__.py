"""Stage 5, service: the running monitor wiring stages 1-4 together, and its checkpointed state."""
