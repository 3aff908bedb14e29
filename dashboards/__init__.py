"""Shipped Grafana dashboards, Prometheus alert rules and their generator (package data)."""
