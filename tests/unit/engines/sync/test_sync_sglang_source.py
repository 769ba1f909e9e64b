"""sglang_source's AST readers on small sources (no wheel, no download)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from knobfleet.engines.sync import sglang_source

ENVIRON = """
import os

class EnvBool: ...

class Envs:
    # ==========
    # Section
    # ==========
    # Turn the thing on.
    SGLANG_THING = EnvBool(False)
    SGLANG_N = EnvInt(8)
    SGLANG_NEW = EnvStrWithAlias("a", deprecated_name="SGLANG_OLD")
    SGLANG_PATH = EnvStr(os.path.expanduser("~"))
    SGLANG_SECRET = EnvStr(None, secret=True)

_DEPRECATED_ENVS: Dict[str, _DeprecatedEnv] = {
    "SGLANG_GONE": _DeprecatedEnv(note="Use --flag instead."),
    "SGLANG_MOVED": _DeprecatedEnv(replacement="SGLANG_N"),
}
"""

CHOICES = """
BACKENDS = ["triton", "flashinfer"]
"""

FIELDS = """
from typing import Literal, Optional, List
from sglang.srt.arg_groups.arg_utils import A, Arg, Derived

class Parallel(msgspec.Struct):
    _NS_PATH = "parallel"
    tp_size: A[int, Arg(help="The tensor parallelism size. More.", aliases=["--tensor-parallel-size"])] = 1
    model_path: A[str, Arg(help="The path of the model weights.", aliases=["--model"])]
    mem: A[Optional[float], "Memory fraction."] = None
    flag: A[bool, "A switch."] = False
    mode: A[Literal["a", "b"], "Mode."] = "a"
    backend: A[Optional[str], Arg(help="Backend.", choices=BACKENDS + ["torch"])] = None
    ids: A[Optional[List[int]], "Ids."] = None
    hidden: A[int, Arg(help="not on the CLI", no_cli=True)] = 0
    derived: A[int, Derived(doc="computed")] = 0
    renamed: A[int, Arg(help="x", cli_name="--other-name")] = 3
    overlap: A[bool, Arg(help="Overlap.", action=argparse.BooleanOptionalAction)] = True
"""

SERVER_ARGS = """
class ServerArgs:
    def add_cli_args(parser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        parser.add_argument("--sampling-backend", type=str, choices=dynamic, default=_declared_default("tp_size"),
                            help="Choose.")
        parser.add_argument("--disable-cuda-graph", action=DeprecatedStoreTrueAction, help="Deprecated. Use x.")
        parser.add_argument("--enable-thing", action=argparse.BooleanOptionalAction, help="Thing.")
"""


def test_parse_environ() -> None:
    env = {e["name"]: e for e in sglang_source.parse_environ(ENVIRON)}
    assert env["SGLANG_THING"]["type"] == "bool" and env["SGLANG_THING"]["default"] is False
    assert env["SGLANG_THING"]["description"] == "Turn the thing on."
    assert env["SGLANG_N"]["type"] == "int" and env["SGLANG_N"]["default"] == 8
    assert env["SGLANG_NEW"]["aliases"] == ["SGLANG_OLD"]
    assert "default" not in env["SGLANG_PATH"] and env["SGLANG_PATH"]["default_expr"] == "os.path.expanduser('~')"
    assert env["SGLANG_SECRET"]["secret"] is True
    assert env["SGLANG_GONE"]["deprecated"] is True and env["SGLANG_GONE"]["description"].startswith("Deprecated.")
    assert env["SGLANG_MOVED"]["replacement"] == "SGLANG_N"
    assert list(env) == sorted(env)


def test_parse_fields() -> None:
    choices = sglang_source._module_constants(sglang_source.ast.parse(CHOICES))
    flags = {f["dest"]: f for f in sglang_source.parse_fields(FIELDS, choices)}
    assert flags["tp_size"]["option_strings"] == ["--tp-size", "--tensor-parallel-size"]
    assert flags["tp_size"]["type"] == "int" and flags["tp_size"]["default"] == 1
    assert flags["model_path"]["required"] is True and flags["model_path"]["option_strings"][1] == "--model"
    assert flags["mem"]["type"] == "float"
    assert flags["flag"]["action"] == "store_true"
    assert flags["mode"]["choices"] == ["a", "b"]
    assert flags["backend"]["choices"] == ["triton", "flashinfer", "torch"]
    assert flags["ids"]["nargs"] == "+" and flags["ids"]["type"] == "int"
    assert "hidden" not in flags and "derived" not in flags
    assert flags["renamed"]["option_strings"] == ["--other-name"]
    # argparse adds --no-overlap itself; the generated catalog must know it (knob negation)
    assert flags["overlap"]["option_strings"] == ["--overlap", "--no-overlap"] and flags["overlap"]["nargs"] == 0
    from knobfleet.engines.sync.build import flag_knob

    knob = flag_knob(flags["overlap"])
    assert knob is not None and knob[0] == "overlap"
    assert knob[1]["negation"] == "no-overlap" and knob[1]["type"] == "bool" and "aliases" not in knob[1]


def test_parse_manual_flags() -> None:
    flags = {f["dest"]: f for f in sglang_source.parse_manual_flags(SERVER_ARGS, {"tp_size": 1}, {})}
    assert flags["sampling_backend"]["default"] == 1
    assert flags["sampling_backend"]["choices_expr"] == "dynamic"
    assert flags["disable_cuda_graph"]["deprecated"] is True
    assert flags["disable_cuda_graph"]["type"] is None and flags["disable_cuda_graph"]["default"] is False
    assert flags["enable_thing"]["option_strings"] == ["--enable-thing", "--no-enable-thing"]
    assert flags["enable_thing"]["type"] is None and flags["enable_thing"]["nargs"] == 0


def _wheel(tmp_path: Path) -> Path:
    path = tmp_path / "sglang-1.2.3-py3-none-any.whl"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("sglang-1.2.3.dist-info/METADATA", "Metadata-Version: 2.1\nName: sglang\nVersion: 1.2.3\n")
        zf.writestr(sglang_source.ENVIRON, ENVIRON)
        zf.writestr(sglang_source.CHOICES, CHOICES)
        zf.writestr(sglang_source.SERVER_ARGS, SERVER_ARGS)
        zf.writestr(sglang_source.FIELDS_DIR + "parallel.py", FIELDS)
        zf.writestr(sglang_source.FIELDS_DIR + "__init__.py", "")
    path.write_bytes(buf.getvalue())
    return path


def test_dump_wheel_and_cached_download(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    dump = sglang_source.dump_wheel(wheel)
    assert dump["engine"] == "sglang" and dump["version"] == "1.2.3"
    assert dump["model"]["flag"] == "model-path"
    assert {f["dest"] for f in dump["flags"]} >= {"tp_size", "sampling_backend"}
    # a wheel already in the cache is used as is (no pip)
    assert sglang_source.download_wheel("1.2.3", tmp_path, python="/nonexistent/python") == wheel
