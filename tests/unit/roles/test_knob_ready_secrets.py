"""A failed start returns the unit's journal tail to the controller (run artifacts, error output). Engines log
their own arguments (SGLang prints its server args, --api-key included): the tail leaves the host with every
secret value of the serve script replaced by its marker, in whatever form the engine printed it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from knobfleet.module_utils.knob_redact import redact_value
from tests.unit.roles.test_knob_ready import kr

KEY = "ab" * 32
API = "sk-Journal\u2028Key-81f2"
TOKEN = "hf_journal_token_55"


class Module:
    def __init__(self, script: Path, log: str) -> None:
        self.params: dict[str, Any] = {"script_path": str(script), "secret": ["api-key"], "secret_key": KEY}
        self.log = log

    def run_command(self, argv: list[str], **_: Any) -> tuple[int, str, str]:
        return 0, self.log, ""


@pytest.mark.parametrize(
    "log",
    [
        f"server_args=ServerArgs(api_key={API!r}, port=30000)\n",  # Python's repr: \u2028 escaped
        f'{{"api_key": "{API}", "hf": "{TOKEN}"}}\n',
        f"started with --api-key {API} and HF_TOKEN={TOKEN}\n",
    ],
)
def test_the_journal_tail_hides_the_scripts_secrets(tmp_path: Path, log: str) -> None:
    script = tmp_path / "serve.sh"
    script.write_text(f"#!/bin/bash\nexport HF_TOKEN={TOKEN}\nexec e '--api-key={API}' --port=30000\n")
    lines = kr.journal(Module(script, log), "eng.service")
    text = "\n".join(lines)
    for piece in (API, *API.splitlines(), repr(API)[1:-1], TOKEN):
        assert piece not in text
    assert redact_value(API, KEY) in text or redact_value(TOKEN, KEY) in text


def test_a_special_file_at_the_script_path_is_not_read(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "serve.sh"
    os.mkfifo(fifo)
    assert kr.journal(Module(fifo, "plain line\n"), "eng.service") == ["plain line"]
