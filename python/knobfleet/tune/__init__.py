"""``knobfleet tune``: a knob space to production in stages (model, kernel, engine, live), with a record."""
