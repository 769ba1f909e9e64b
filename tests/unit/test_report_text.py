"""``visible`` (every human rendering) and ``rules.shown`` (every one-line message) escape what does not show:
the Unicode categories that never show as themselves (Cc, Cf, Cs, Co, Cn, Zl, Zp, Zs but U+0020) and the blank
letters and symbols ``str.isprintable`` passes (U+3164 HANGUL FILLER, U+2800 BRAILLE PATTERN BLANK, the variation
selectors, the rest of Unicode's Default_Ignorable_Code_Point set). Issue 56, cause 11."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knobfleet import rules
from knobfleet.report_text import table, visible

# The oracle, written out here rather than read from the package: each of these passes ``isprintable`` today.
BLANK_LETTERS = {
    "\u115f": "HANGUL CHOSEONG FILLER",
    "\u1160": "HANGUL JUNGSEONG FILLER",
    "\u3164": "HANGUL FILLER",
    "\uffa0": "HALFWIDTH HANGUL FILLER",
    "\u2800": "BRAILLE PATTERN BLANK",
    "\U0001d159": "MUSICAL SYMBOL NULL NOTEHEAD",
    "\u034f": "COMBINING GRAPHEME JOINER",
    "\u17b4": "KHMER VOWEL INHERENT AQ",
    "\u180b": "MONGOLIAN FREE VARIATION SELECTOR ONE",
    "\ufe00": "VARIATION SELECTOR-1",
    "\ufe0f": "VARIATION SELECTOR-16",
    "\U000e0100": "VARIATION SELECTOR-17",
    "\U000e01ef": "VARIATION SELECTOR-256",
}
# Format, control and separator characters (isprintable already refuses them: they must stay escaped).
FORMAT = ["\x1b", "\x7f", "\x85", "\u00ad", "\u061c", "\u180e", "\u200b", "\u200c", "\u200d", "\u200e", "\u200f",
          "\u202e", "\u2060", "\u2061", "\u2062", "\u2063", "\u2064", "\u2066", "\u2069", "\ufeff", "\u2028",
          "\u2029", "\u00a0", "\u3000", "\ue000", "\udcff", "\U0001d173", "\U000e0001", "\U000e007f"]  # fmt: skip
INVISIBLE_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"}


def hides(ch: str) -> bool:
    return ch != " " and (unicodedata.category(ch) in INVISIBLE_CATEGORIES or ch in BLANK_LETTERS)


def test_the_blank_letters_pass_isprintable_so_a_rule_of_isprintable_alone_misses_them() -> None:
    assert all(ch.isprintable() and unicodedata.name(ch) == name for ch, name in BLANK_LETTERS.items())


@pytest.mark.parametrize("ch", [*BLANK_LETTERS, *FORMAT], ids=lambda c: f"U+{ord(c):04X}")
def test_each_blank_format_or_control_character_is_escaped(ch: str) -> None:
    code = f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}"
    assert rules.invisible(ch)
    assert visible(f"host{ch}name") == f"host{code}name"
    assert rules.shown(f"host{ch}name") == f"'host{code}name'"
    assert ch not in table(["host"], [[f"a{ch}b"]])
    assert rules.first_invisible(f"ab{ch}") == (2, ch)


@pytest.mark.parametrize("text", ["plain", "café ünï", "日本語のテキスト", "한국어", "emoji 🚀", "x\u0301", "a b"])
def test_text_that_shows_is_left_as_it_is(text: str) -> None:
    assert visible(text) == text and rules.shown(text) == text and rules.first_invisible(text) is None


HOSTILE = st.one_of(
    st.characters(categories=sorted(INVISIBLE_CATEGORIES)),  # type: ignore[arg-type]
    st.sampled_from(sorted(BLANK_LETTERS)),
    st.characters(),
)
# any text with at least one character that does not show, somewhere in it
WITH_ONE = st.builds(lambda a, ch, b: a + ch + b, st.text(HOSTILE), st.sampled_from([*BLANK_LETTERS, *FORMAT]),
                     st.text(HOSTILE))  # fmt: skip


@given(st.one_of(WITH_ONE, st.text(HOSTILE)))
def test_visible_output_has_nothing_that_does_not_show_but_newlines_and_tabs(text: str) -> None:
    out = visible(text)
    assert not any(hides(c) for c in out if c not in "\n\t"), ascii(out)
    assert all(c in out for c in text if not hides(c) or c in "\n\t")  # what shows is kept
    if not any(hides(c) for c in text if c not in "\n\t"):
        assert out == text


@given(st.one_of(WITH_ONE, st.text(HOSTILE)))
def test_a_shown_value_is_one_line_with_nothing_that_does_not_show(text: str) -> None:
    out = rules.shown(text)
    assert not any(hides(c) for c in out), ascii(out)
    assert (out == text) == (not any(hides(c) for c in text))
