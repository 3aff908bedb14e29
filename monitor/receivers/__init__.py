"""Stage 1, receivers: OTLP over gRPC and HTTP, and span files, in; ``SpanRecord`` batches out."""
