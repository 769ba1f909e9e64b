"""The lab: an embedded fleet of systemd-nspawn hosts running the stand-in engine (``sim``)."""
