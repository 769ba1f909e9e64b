"""knobfleet: deploy versioned knob profiles to GPU inference hosts and prove they took effect."""

__version__ = "0.2.8"
