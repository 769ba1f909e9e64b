"""The one reader of serve scripts: a small shell lexer (statements, words and where each word is written) and
what a serve script exports and execs. Pure, standard library only, no imports at all: the probe runs it on every
host on every ``drift`` (through knob_pkgmeta, which reads the launcher from the exec line, and knob_redact, which
replaces a secret's whole word by its span). Split out of knob_redact; callers import these names from here: the
controller as ``knobfleet.module_utils.knob_shell``, the roles' modules as ``ansible.module_utils.knob_shell``.
"""

from __future__ import annotations


def shell_statements(text: str) -> list[list[str]]:
    """Split shell text into statements (lists of words) the way bash reads simple scripts: single quotes are
    literal, double quotes honour backslash before $ ` " \\ and newline, an unquoted backslash escapes the
    next character (backslash-newline joins lines), # starts a comment at a word start, and newline or ;
    ends a statement. Expansions ($VAR, $(...)) are kept as text, never run."""
    return [[w for w, _start, _end in st] for st in shell_spans(text)]


def shell_spans(text: str) -> list[list[tuple[str, int, int]]]:
    """``shell_statements`` with each word's place in ``text``: (word, start, end), ``text[start:end]`` being the
    word as written (quotes included). The one lexer: redaction replaces a secret's whole word by its span."""
    statements: list[list[tuple[str, int, int]]] = []
    words: list[tuple[str, int, int]] = []
    word: list[str] = []
    in_word, i, n, start = False, 0, len(text), 0

    def begin() -> None:
        nonlocal in_word, start
        if not in_word:
            in_word, start = True, i

    def end_word() -> None:
        nonlocal word, in_word
        if in_word:
            words.append(("".join(word), start, i))
        word, in_word = [], False

    def end_statement() -> None:
        nonlocal words
        end_word()
        if words:
            statements.append(words)
        words = []

    while i < n:
        c = text[i]
        if c == "'":
            begin()
            j = text.find("'", i + 1)
            j = n if j < 0 else j
            word.append(text[i + 1 : j])
            i = min(j + 1, n)
            continue
        if c == '"':
            begin()
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n and text[i + 1] in '$`"\\\n':
                    if text[i + 1] != "\n":
                        word.append(text[i + 1])
                    i += 2
                    continue
                word.append(text[i])
                i += 1
            i = min(i + 1, n)
            continue
        if c == "\\":
            if i + 1 < n and text[i + 1] != "\n":
                begin()
                word.append(text[i + 1])
            i = min(i + 2, n)
            continue
        if c == "#" and not in_word:
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c in "\n;":
            end_statement()
            i += 1
            continue
        if c in " \t":
            end_word()
            i += 1
            continue
        begin()
        word.append(c)
        i += 1
    end_statement()
    return statements


def script_env_argv(text: str) -> tuple[dict[str, str], list[str]]:
    """Exported env vars and the exec argv of a serve script (knobfleet's or a simple hand-written one)."""
    env: dict[str, str] = {}
    argv: list[str] = []
    for words in shell_statements(text):
        if words[0] == "export":
            for w in words[1:]:
                name, sep, value = w.partition("=")
                if sep and name and name.replace("_", "a").isalnum() and name.isascii() and not name[0].isdigit():
                    env[name] = value
        elif words[0] == "exec":
            argv = words[1:]
    return env, argv
