"""The calibration store: ``calibrations.json`` next to ``gpus.json``, one entry per GPU fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

from knobfleet import safefile, waves
from knobfleet.errors import KnobfleetError

COMMENT = (
    "Wave-planner GPU terms fitted by `knobfleet waves calibrate` from `knobfleet kernel bench` sweeps, keyed by "
    "GPU fingerprint (device name|compute capability|SMs). Read by knobfleet.waves.calibration_for."
)


def default_path() -> Path:
    return Path(waves.__file__).with_name(waves.CALIBRATIONS_FILE)


def save(cal: waves.Calibration, path: Path | None = None) -> Path:
    """Add or replace ``cal`` (by fingerprint) in the store; atomic; keys sorted so diffs stay small."""
    file = path or default_path()
    data: dict[str, object] = {}
    if file.exists():
        try:
            loaded = safefile.loads_json(safefile.read_text(file, 16 * safefile.MIB, "calibrations file"),
                                         "calibrations file")  # fmt: skip
        except safefile.FileRefused as exc:
            raise KnobfleetError(f"{file}: {exc}; nothing was written") from None
        if not isinstance(loaded, dict):
            raise KnobfleetError(
                f"{file}: not a calibrations file (a JSON {type(loaded).__name__}); nothing was written"
            )
        data = loaded
    data["_comment"] = COMMENT
    data[cal.fingerprint] = cal.as_json()
    safefile.write_text(file, json.dumps(data, indent=2, sort_keys=True) + "\n")  # temp + rename; never a symlink
    return file
