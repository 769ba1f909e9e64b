"""The bench client (stdlib only; shipped to hosts by roles/knob_bench)."""
