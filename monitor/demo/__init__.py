"""``assaywatch demo``: the simulated support agent and the terminal view."""
