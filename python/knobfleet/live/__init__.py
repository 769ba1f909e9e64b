"""Live state: the one rule (module_utils/knob_live.py) wrapped in typed findings and host verdicts."""
