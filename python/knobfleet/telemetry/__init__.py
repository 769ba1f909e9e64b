"""Live telemetry: the Prometheus scrape config generated from the inventory (``promconfig``, pure) and a small
client of Prometheus's HTTP API (``prom``)."""
