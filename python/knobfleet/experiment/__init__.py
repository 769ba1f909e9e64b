"""A/B experiments: pure statistics (stats), the AB/BA schedule and sequential stopping rule (design),
and the rendered reports (report)."""
