"""The monitor beyond one machine: two stages over Kafka (DESIGN.md "Scale-out").

Stage 1, ``assembler.py``: assemblers in one consumer group read the spans topic the
OpenTelemetry Collector's kafka exporter writes (partitioned by trace id), assemble runs with
the monitor's own pipeline and publish compact run records (``records.py``) keyed by
stream. Stage 2, ``detector.py``: detector workers in another group run the monitor's engine
per partition of the runs topic, checkpoint each partition's state with its next input
offset to a compacted topic and publish alarm onsets with deterministic ids.
``settings.py`` is the ``kafka:`` config section, ``clients.py`` the Kafka client plumbing
(confluent-kafka, the ``kafka`` extra, imported lazily).
"""
