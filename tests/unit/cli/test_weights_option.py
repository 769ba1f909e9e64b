"""--weights is checked while the command line is parsed (issue 58): a non-finite, negative or all-zero weight is
the usage error (64) in one line, for `waves` with or without --suggest and for `ab`, before any work."""

from __future__ import annotations

import pytest

from knobfleet import cli
from knobfleet.errors import EXIT_USAGE

BAD = ["48=nan", "48=inf", "48=-1", "48=0,64=0", "48", "x=1", "48=1e999"]


@pytest.mark.parametrize("weights", BAD)
@pytest.mark.parametrize(
    "argv",
    [
        ["waves", "--knob", "SGLANG_SM120_MMA_TARGET_CTAS=512"],
        ["waves", "--knob", "SGLANG_SM120_MMA_TARGET_CTAS=512", "--suggest", "--no-write"],
        ["ab", "default", "ctas512"],
    ],
    ids=["waves", "waves --suggest", "ab"],
)
def test_a_bad_weight_is_a_usage_error(argv: list[str], weights: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:  # argparse's usage error, before any command runs
        cli.run([*argv, "--weights", weights])
    assert exc.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--weights" in err and err.count("\n") == 1, err


def test_good_weights_pass_the_parser() -> None:
    from knobfleet.cli.parse import weights_option

    assert weights_option("48=0.3,64=0.7") == "48=0.3,64=0.7"
