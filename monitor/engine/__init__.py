"""Stage 3, engine: assembled runs in, per-stream baselines, detectors and alarms out."""
