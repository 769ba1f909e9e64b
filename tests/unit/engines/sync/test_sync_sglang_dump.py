"""sglang_dump's readers on small fakes built here (no SGLang: knobfleet's venv has none), and the --from-install
path of ``catalog sync sglang`` (sync.dump_installed_sglang, the CLI) with a fake ``sglang`` package on the path."""

from __future__ import annotations

import argparse
import ast
import enum
import json
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from knobfleet import cli
from knobfleet.cli import catalog as catalog_cli
from knobfleet.engines import sync
from knobfleet.engines.sync import build, sglang_dump
from knobfleet.errors import EXIT_ERROR, EXIT_OK, EXIT_USAGE, KnobfleetError

RECORDED = Path(__file__).parent / "data" / "sglang-0.5.23.json"

# A small sglang/srt/environ.py: the descriptor classes the real one has, and an Envs class using each kind of
# default the real one uses (literal, arithmetic, IntEnum member, import-time call, lambda, function, tuple()).
ENVIRON = textwrap.dedent(
    """
    import enum
    import os


    class EnvField:
        def __init__(self, default, secret=False):
            self.default = default
            self.secret = secret

        def __set_name__(self, owner, name):
            self.name = name


    class EnvBool(EnvField):
        pass


    class EnvInt(EnvField):
        pass


    class EnvFloat(EnvField):
        pass


    class EnvStr(EnvField):
        pass


    class EnvTuple(EnvField):
        pass


    class EnvJSON(EnvField):
        pass


    class _DeprecatedEnvFallback:
        def __init__(self, default, deprecated_name, secret=False):
            super().__init__(default, secret=secret)
            self.deprecated_name = deprecated_name


    class EnvBoolWithAlias(_DeprecatedEnvFallback, EnvBool):
        pass


    class Level(enum.IntEnum):
        OFF = 0
        ON = 1


    def _default_hip():
        return False


    class _DeprecatedEnv:
        def __init__(self, replacement=None, transform=None, note=None):
            self.replacement = replacement
            self.transform = transform
            self.note = note


    class Envs:
        # ==========
        # Section
        # ==========
        # Turn the thing on.
        SGLANG_THING = EnvBool(False)
        SGLANG_SIZE = EnvInt(16 * 1024)
        SGLANG_LEVEL = EnvInt(Level.ON)
        SGLANG_RATIO = EnvFloat(0.5)
        SGLANG_NONE = EnvStr(None)
        # Where things go.
        # Second line.
        SGLANG_HOME = EnvStr(os.path.expanduser("~/.cache/x"))
        SGLANG_LAZY = EnvStr(lambda: "computed")
        SGLANG_HIP = EnvBool(_default_hip)
        SGLANG_LIST = EnvTuple(tuple())
        SGLANG_CFG = EnvJSON(None)
        SGLANG_NEW = EnvBoolWithAlias(
            True, deprecated_name="SGLANG_OLD"
        )
        SGLANG_KEY = EnvStr(None, secret=True)
        NOT_A_FIELD = 3


    _DEPRECATED_ENVS = {
        "SGLANG_GONE": _DeprecatedEnv(note="Use --flag instead."),
        "SGLANG_MOVED": _DeprecatedEnv(replacement="SGLANG_SIZE"),
        "SGLANG_THING": _DeprecatedEnv(),
    }
    """
)


def load_environ(source: str = ENVIRON) -> types.ModuleType:
    mod = types.ModuleType("fake_environ")
    exec(compile(source, "environ.py", "exec"), mod.__dict__)
    return mod


def env_entries() -> dict[str, dict[str, Any]]:
    mod = load_environ()
    entries = sglang_dump.env_registry(mod.Envs, mod.EnvField, mod._DEPRECATED_ENVS, ENVIRON)
    return {e["name"]: e for e in entries}


ENV_CASES: list[tuple[str, dict[str, Any]]] = [
    (
        "SGLANG_THING",
        {"name": "SGLANG_THING", "annotation": "EnvBool", "type": "bool", "default": False,
         "description": "Turn the thing on."},
    ),
    (  # the value the class computed, where the source only has an expression
        "SGLANG_SIZE",
        {"name": "SGLANG_SIZE", "annotation": "EnvInt", "type": "int", "default": 16384, "description": ""},
    ),
    (  # an IntEnum member as its int
        "SGLANG_LEVEL",
        {"name": "SGLANG_LEVEL", "annotation": "EnvInt", "type": "int", "default": 1, "description": ""},
    ),
    ("SGLANG_RATIO", {"name": "SGLANG_RATIO", "annotation": "EnvFloat", "type": "float", "default": 0.5,
                      "description": ""}),
    ("SGLANG_NONE", {"name": "SGLANG_NONE", "annotation": "EnvStr", "type": "str", "default": None,
                     "description": ""}),
    (  # machine-dependent (import-time call): the expression, not this machine's value
        "SGLANG_HOME",
        {"name": "SGLANG_HOME", "annotation": "EnvStr", "type": "str",
         "default_expr": "os.path.expanduser('~/.cache/x')", "description": "Where things go. Second line."},
    ),
    (  # computed when read
        "SGLANG_LAZY",
        {"name": "SGLANG_LAZY", "annotation": "EnvStr", "type": "str", "default_expr": "lambda: 'computed'",
         "description": ""},
    ),
    ("SGLANG_HIP", {"name": "SGLANG_HIP", "annotation": "EnvBool", "type": "bool", "default_expr": "_default_hip",
                    "description": ""}),
    ("SGLANG_LIST", {"name": "SGLANG_LIST", "annotation": "EnvTuple", "type": "tuple", "default": [],
                     "description": ""}),
    ("SGLANG_CFG", {"name": "SGLANG_CFG", "annotation": "EnvJSON", "type": "json", "default": None,
                    "description": ""}),
    (  # a subclass's type by its MRO; the deprecated spelling as an alias; a multi-line call
        "SGLANG_NEW",
        {"name": "SGLANG_NEW", "annotation": "EnvBoolWithAlias", "type": "bool", "default": True,
         "aliases": ["SGLANG_OLD"], "description": ""},
    ),
    ("SGLANG_KEY", {"name": "SGLANG_KEY", "annotation": "EnvStr", "type": "str", "default": None, "secret": True,
                    "description": ""}),
    ("SGLANG_GONE", {"name": "SGLANG_GONE", "type": "str", "deprecated": True,
                     "description": "Deprecated. Use --flag instead."}),
    ("SGLANG_MOVED", {"name": "SGLANG_MOVED", "type": "str", "deprecated": True, "replacement": "SGLANG_SIZE",
                      "description": "Deprecated."}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "expected"), ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_env_entry(name: str, expected: dict[str, Any]) -> None:
    assert env_entries()[name] == expected


def test_env_registry_is_every_descriptor_sorted_and_envs_wins_over_deprecated() -> None:
    entries = env_entries()
    assert list(entries) == sorted(c[0] for c in ENV_CASES)  # NOT_A_FIELD is no descriptor
    assert "deprecated" not in entries["SGLANG_THING"]


def test_env_registry_without_source_has_values_but_no_descriptions() -> None:
    mod = load_environ()
    entries = {e["name"]: e for e in sglang_dump.env_registry(mod.Envs, mod.EnvField)}
    assert entries["SGLANG_THING"]["description"] == "" and entries["SGLANG_THING"]["default"] is False
    assert entries["SGLANG_LAZY"]["default_expr"] == "Envs.<lambda>"
    assert "SGLANG_GONE" not in entries


@pytest.mark.parametrize(
    ("expr", "static"),
    [
        ("False", True),
        ("16 * 1024", True),
        ("2 ** 31", True),
        ("-1", True),
        ("GateGemvMode.PAIR", True),
        ("tuple()", True),
        ("'/tmp/x_{device_uuid}.sock'", True),
        ("os.path.expanduser('~/.cache/sglang')", False),
        ("os.cpu_count()", False),
        ("int(os.environ.get('X', '1'))", False),
        ("lambda: _default_cache_subdir('ple')", False),
    ],
)
def test_is_static(expr: str, static: bool) -> None:
    assert sglang_dump.is_static(ast.parse(expr, mode="eval").body) is static


def test_env_type_by_mro() -> None:
    class EnvField:
        pass

    class EnvInt(EnvField):
        pass

    class EnvIntWithAlias(EnvInt):
        pass

    class EnvOdd(EnvField):
        pass

    assert sglang_dump.env_type(EnvIntWithAlias()) == ("int", "EnvIntWithAlias")
    assert sglang_dump.env_type(EnvOdd()) == ("str", "EnvOdd")  # unknown: argparse's default, like build's


# --- flags ------------------------------------------------------------------------------------------


def human_readable_int(value: str) -> int:
    return int(value.rstrip("k")) * (1000 if value.endswith("k") else 1)


class DeprecatedStoreTrueAction(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, nargs: int = 0, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=nargs, const=True, default=False, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError


class LoRAPathAction(argparse.Action):
    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError


class Mode(enum.IntEnum):
    OFF = 0
    ON = 1


class Opaque:
    pass


FLAG_CASES: list[tuple[str, tuple[str, ...], dict[str, Any], dict[str, Any]]] = [
    (
        "store-with-alias",
        ("--tp-size", "--tensor-parallel-size"),
        {"type": int, "default": 1, "dest": "tp_size", "help": "The tensor  parallelism\n size."},
        {"dest": "tp_size", "option_strings": ["--tp-size", "--tensor-parallel-size"], "positional": False,
         "action": "store", "type": "int", "nargs": None, "required": False,
         "help": "The tensor parallelism size.", "hidden": False, "default": 1},
    ),
    (
        "store-true",
        ("--trust-remote-code",),
        {"action": "store_true", "help": "Trust."},
        {"action": "store_true", "type": None, "nargs": 0, "default": False},
    ),
    (
        "boolean-optional",
        ("--enable-overlap",),
        {"action": argparse.BooleanOptionalAction, "default": True, "help": "Overlap."},
        {"action": "boolean_optional", "option_strings": ["--enable-overlap", "--no-enable-overlap"], "nargs": 0,
         "default": True},
    ),
    (  # a set of choices (sampling-backend): sorted
        "choices-set",
        ("--sampling-backend",),
        {"type": str, "choices": {"pytorch", "flashinfer"}, "help": "Sampling."},
        {"choices": ["flashinfer", "pytorch"], "default": None},
    ),
    (  # computed choices (['auto'] + parser names): as the parser has them
        "choices-list",
        ("--reasoning-parser",),
        {"type": str, "choices": ["auto", "qwen3", "deepseek-r1"], "help": "Reasoning."},
        {"choices": ["auto", "qwen3", "deepseek-r1"]},
    ),
    (
        "choices-enum",
        ("--mode",),
        {"type": int, "choices": list(Mode), "default": Mode.ON, "help": "Mode."},
        {"choices": [0, 1], "default": 1},
    ),
    (
        "hidden",
        ("--forward-pass-metrics-worker-id",),
        {"type": str, "default": "", "help": argparse.SUPPRESS},
        {"hidden": True, "help": "", "default": ""},
    ),
    (
        "deprecated-action",
        ("--disable-cuda-graph",),
        {"action": DeprecatedStoreTrueAction, "help": "Deprecated. Use --cuda-graph-backend-decode=disabled."},
        {"action": "DeprecatedStoreTrueAction", "deprecated": True, "nargs": 0, "default": False, "type": None},
    ),
    (
        "deprecated-help",
        ("--grpc-mode",),
        {"action": "store_true", "help": "(Deprecated, use --smg-grpc-mode) Legacy."},
        {"action": "store_true", "deprecated": True},
    ),
    (
        "custom-action-nargs",
        ("--lora-paths",),
        {"action": LoRAPathAction, "type": str, "nargs": "*", "help": "Adapters."},
        {"action": "LoRAPathAction", "type": "str", "nargs": "*"},
    ),
    (
        "value-parser",
        ("--context-length",),
        {"type": human_readable_int, "help": "Context.\n\nAccepts 2k."},
        {"type": "human_readable_int", "help": "Context. Accepts 2k."},
    ),
    (
        "stdlib-parser",
        ("--json-model-override-args",),
        {"type": json.loads, "default": "{}", "help": "Overrides."},
        {"type": "loads", "default": "{}"},
    ),
    (
        "list-default",
        ("--cuda-graph-bs",),
        {"type": int, "nargs": "+", "default": [1, 2, 4], "help": "Batch sizes."},
        {"nargs": "+", "default": [1, 2, 4]},
    ),
    (
        "opaque-default",
        ("--stat-loggers",),
        {"type": str, "default": Opaque(), "help": "Loggers."},
        {"default_repr": "Opaque"},
    ),
    (
        "suppressed-default",
        ("--config",),
        {"type": str, "default": argparse.SUPPRESS, "help": "Config file."},
        {"type": "str"},
    ),
    (
        "required-and-address",
        ("--dist-init-addr",),
        {"type": str, "required": True, "help": "e.g. 192.168.0.2:25000 or 127.0.0.1:25000."},
        {"required": True, "help": "e.g. HOST:25000 or 127.0.0.1:25000."},
    ),
]  # fmt: skip


@pytest.mark.parametrize(("case", "options", "kwargs", "expected"), FLAG_CASES, ids=[c[0] for c in FLAG_CASES])
def test_flag_entry(case: str, options: tuple[str, ...], kwargs: dict[str, Any], expected: dict[str, Any]) -> None:
    parser = argparse.ArgumentParser()
    action = parser.add_argument(*options, **kwargs)
    entry = sglang_dump.flag_entry(action)
    assert {k: entry.get(k, "<absent>") for k in expected} == expected
    if "default_repr" in expected or kwargs.get("default") is argparse.SUPPRESS:
        assert "default" not in entry
    if "deprecated" not in expected:
        assert "deprecated" not in entry
    json.dumps(entry)  # all of it is JSON


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang serve")
    parser.add_argument("--model-path", "--model", type=str, required=True, help="The path of the model weights.")
    parser.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1, dest="tp_size", help="TP size.")
    parser.add_argument("--enable-overlap", action=argparse.BooleanOptionalAction, default=True, help="Overlap.")
    parser.add_argument("--sampling-backend", type=str, choices={"pytorch", "flashinfer"}, help="Sampling.")
    parser.add_argument("--lora-paths", action=LoRAPathAction, type=str, nargs="*", help="Adapters.")
    parser.add_argument("--disable-cuda-graph", action=DeprecatedStoreTrueAction, help="Deprecated. Use x.")
    return parser


def test_flags_sorted_without_help() -> None:
    entries = sglang_dump.flags(make_parser())
    assert [e["dest"] for e in entries] == [
        "disable_cuda_graph", "enable_overlap", "lora_paths", "model_path", "sampling_backend", "tp_size",
    ]  # fmt: skip


def test_model_section() -> None:
    assert sglang_dump.model_section(sglang_dump.flags(make_parser())) == {
        "style": "flag",
        "flag": "model-path",
        "launcher": "python -m sglang.launch_server",
    }
    with pytest.raises(RuntimeError, match="model_path"):
        sglang_dump.model_section([])


def test_dump_has_sglang_source_shape_and_builds_a_catalog() -> None:
    mod = load_environ()
    env = sglang_dump.env_registry(mod.Envs, mod.EnvField, mod._DEPRECATED_ENVS, ENVIRON)
    doc = sglang_dump.make_dump("9.9.9", env, sglang_dump.flags(make_parser()))
    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))  # sglang_source's dump of the 0.5.23 wheel
    assert set(doc) == set(recorded) and doc["model"] == recorded["model"]
    env_keys = set().union(*(set(e) for e in recorded["env"])) | {"replacement"}  # sglang_source has it too
    flag_keys = set().union(*(set(e) for e in recorded["flags"])) | {"default_repr"}
    assert all(set(e) <= env_keys for e in doc["env"])
    assert all(set(e) <= flag_keys for e in doc["flags"])
    knobs = build.build_catalog(doc)["knobs"]
    assert knobs["SGLANG_SIZE"]["default"] == 16384 and "default" not in knobs["SGLANG_HOME"]
    assert knobs["SGLANG_NEW"]["aliases"] == ["SGLANG_OLD"]
    assert knobs["tp-size"]["aliases"] == ["tensor-parallel-size"] and knobs["tp-size"]["type"] == "int"
    assert knobs["enable-overlap"]["negation"] == "no-enable-overlap"
    assert knobs["sampling-backend"]["choices"] == ["flashinfer", "pytorch"]
    assert knobs["lora-paths"]["nargs"] == "*"
    assert knobs["disable-cuda-graph"]["type"] == "bool" and knobs["disable-cuda-graph"]["deprecated"] is True
    assert build.build_catalog(doc)["source"].startswith("env: sglang.srt.environ.Envs")


# --- --from-install: sync.dump_installed_sglang and the CLI, with a fake sglang on the path -------------------

SERVER_ARGS = textwrap.dedent(
    """
    import argparse
    import os


    class ServerArgs:
        @staticmethod
        def add_cli_args(parser):
            parser.add_argument("--model-path", type=str, required=True, help="The model.")
            choices = ["a", "b"] + (["leaked"] if os.environ.get("SGLANG_FAKE_EXTRA") else [])
            parser.add_argument("--backend", type=str, choices=choices, default="a", help="Backend.")
            parser.add_argument("--cpu-engine", type=str, default=os.environ.get("SGLANG_USE_CPU_ENGINE"), help="x")
    """
)


def fake_sglang(root: Path, version: str = "0.5.23") -> Path:
    srt = root / "sglang" / "srt"
    srt.mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    (srt / "__init__.py").write_text("")
    (srt / "environ.py").write_text(ENVIRON)
    (srt / "server_args.py").write_text(SERVER_ARGS)
    dist = root / f"sglang-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return root


@pytest.fixture
def fake_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Our own python, with a fake sglang 0.5.23 on its path (what the dump script imports)."""
    monkeypatch.setenv("PYTHONPATH", str(fake_sglang(tmp_path / "site")))
    monkeypatch.setenv("SGLANG_FAKE_EXTRA", "1")  # the caller's SGLANG_* never reach the import
    return Path(sys.executable)


def test_sync_from_install_writes_the_catalog(fake_install: Path, tmp_path: Path) -> None:
    path = sync.sync("sglang", tmp_path / "out", from_install=fake_install)
    assert path == tmp_path / "out" / "sglang.yaml"
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# Generated by `knobfleet catalog sync sglang` from sglang 0.5.23")
    catalog = yaml.safe_load(text)
    assert catalog["model"] == {"style": "flag", "flag": "model-path"}
    assert catalog["knobs"]["backend"]["choices"] == ["a", "b"]
    assert catalog["knobs"]["cpu-engine"]["default"] == "1"  # sync's own SGLANG_USE_CPU_ENGINE=1
    assert catalog["knobs"]["SGLANG_SIZE"]["default"] == 16384
    assert text == sync.render_dump(sync.dump("sglang", from_install=fake_install))


def test_sync_from_install_checks_the_version(fake_install: Path, tmp_path: Path) -> None:
    with pytest.raises(KnobfleetError, match=r"has sglang 0\.5\.23, not 9\.9\.9: pass --version 0\.5\.23"):
        sync.sync("sglang", tmp_path, version="9.9.9", from_install=fake_install)
    assert sync.sync("sglang", tmp_path, version="0.5.23", from_install=fake_install).is_file()


def test_sync_from_install_failures_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KnobfleetError, match="no python at"):
        sync.dump_installed_sglang(tmp_path / "missing" / "python")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # no sglang there
    with pytest.raises(KnobfleetError, match=r"(?s)sglang_dump\.py failed .*No module named 'sglang'"):
        sync.dump_installed_sglang(Path(sys.executable))
    with pytest.raises(ValueError, match="sglang only"):
        sync.dump("vllm", from_install=Path(sys.executable))


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ({"PATH": "/bin"}, {"PATH": "/bin"}),
        ({"PATH": "/bin", "SGLANG_PORT": "1", "SGL_X": "2", "SGLANG_USE_CPU_ENGINE": "0"}, {"PATH": "/bin"}),
        ({"HF_HUB_OFFLINE": "0", "MY_SGLANG_X": "kept"}, {"MY_SGLANG_X": "kept"}),
    ],
)
def test_sglang_dump_env(base: dict[str, str], expected: dict[str, str]) -> None:
    assert sync.sglang_dump_env(base) == {**expected, **sync.SGLANG_DUMP_ENV}


def call(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.run(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, Path, str | None, Path | None]]:
    seen: list[tuple[str, Path, str | None, Path | None]] = []

    def fake_sync(engine: str, out_dir: Path, version: str | None = None, from_install: Path | None = None) -> Path:
        seen.append((engine, out_dir, version, from_install))
        return tmp_path / f"{engine}.yaml"

    monkeypatch.setattr(sync, "sync", fake_sync)
    return seen


LAB = "<the lab install's python>"


@pytest.mark.parametrize(
    ("argv", "out_dir", "version", "from_install"),
    [
        (["sglang"], None, None, None),
        (["sglang", "--from-install", "/opt/sgl/bin/python"], None, None, "/opt/sgl/bin/python"),
        (["sglang", "--from-install"], None, None, LAB),
        (["sglang", "--from-install", "--out-dir", "/tmp/x"], Path("/tmp/x"), None, LAB),
        (["sglang", "--from-install", "--version", "0.5.23"], None, "0.5.23", LAB),
        (["sglang", "--out-dir", "/tmp/x", "--version", "0.5.23"], Path("/tmp/x"), "0.5.23", None),
    ],
)
def test_cli_catalog_sync_from_install(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    calls: list[tuple[str, Path, str | None, Path | None]],
    tmp_path: Path,
    argv: list[str],
    out_dir: Path | None,
    version: str | None,
    from_install: str | None,
) -> None:
    from knobfleet import paths

    lab_python = tmp_path / "sglang-0.5.23" / "venv" / "bin" / "python"
    lab_python.parent.mkdir(parents=True)
    lab_python.touch()
    asked: list[str | None] = []
    monkeypatch.setattr(catalog_cli, "lab_sglang_python", lambda version=None: asked.append(version) or lab_python)
    monkeypatch.setattr(sync, "pinned_version", lambda engine: "0.5.23")
    code, out, _ = call(capsys, "catalog", "sync", *argv)
    assert code == EXIT_OK
    python = lab_python if from_install == LAB else (Path(from_install) if from_install else None)
    assert calls == [("sglang", out_dir or paths.catalogs_dir() / "generated", version, python)]
    assert asked == ([version] if from_install == LAB else [])
    assert out.endswith(f"installed for {python}\n" if python else "from sglang 0.5.23\n")


def test_cli_from_install_defaults_to_the_lab_install() -> None:
    from knobfleet.lab import sglang_install

    assert catalog_cli.lab_sglang_python() == sglang_install.layout().python
    assert catalog_cli.lab_sglang_python("0.5.22") == sglang_install.layout("0.5.22").python


def test_cli_from_install_errors(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    calls: list[tuple[str, Path, str | None, Path | None]],
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(catalog_cli, "lab_sglang_python", lambda version=None: tmp_path / "venv" / "bin" / "python")
    code, _, err = call(capsys, "catalog", "sync", "sglang", "--from-install")
    assert code == EXIT_ERROR and "no SGLang install at" in err and "knobfleet.lab.sglang_install" in err
    code, _, err = call(capsys, "catalog", "sync", "vllm", "--from-install", "/x/python")
    assert code == EXIT_USAGE and "--from-install is for sglang only" in err
    assert calls == []
