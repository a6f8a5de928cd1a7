"""What an engine's serve parser accepts, read from the parser itself (standard library only).

``gpuserve engine add`` runs this file with the Python of a throwaway venv that holds the
engine (``<venv>/bin/python engine_parser.py vllm``): it builds the engine's own serve parser and
prints one JSON object, every long option with what argparse knows of it. Nothing here imports
gpuserve or anything outside the standard library, so the file runs in any engine venv as it is.

Per option (``describe``): ``switch`` (takes no value: store_true, store_false, store_const,
BooleanOptionalAction), ``nargs``, ``type`` (the name of argparse's ``type``: ``int``, ``float``,
``str`` for the built-ins, else the callable's own name, e.g. vLLM's ``human_readable_int``),
``none`` (the type is a wrapper that also takes ``None``: vLLM's ``optional_type(int)``, whose
wrapped type is read from its closure) and ``choices``. argparse has no notion of a range: a
bound exists only where an action carries ``min``/``max`` attributes itself, and ``describe``
records it only then (vLLM's and SGLang's parsers carry none; docs/recipes.md).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

BUILTIN_TYPES = {int: "int", float: "float", str: "str"}
# vLLM's make_arg_parser, by release (the first that imports wins)
VLLM_PARSERS = ("vllm.entrypoints.common.cli_args",     # 0.33, 0.34
                "vllm.entrypoints.launchers.cli_args",  # 0.32
                "vllm.entrypoints.openai.cli_args")     # older


def _json_value(value: Any) -> Any:
    """A choice or bound as JSON: numbers and strings as they are, an enum member by its
    string value, anything else as argparse prints it."""
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        return value
    inner = getattr(value, "value", None)
    return inner if isinstance(inner, str) else str(value)


def type_of(t: Any) -> tuple[str | None, bool]:
    """(the type's name, whether it also takes None). A wrapper around one built-in type
    (vLLM's ``optional_type(int)``: a closure over ``int``) is that type, taking None too."""
    if t is None:
        return None, False
    if t in BUILTIN_TYPES:
        return BUILTIN_TYPES[t], False
    name = getattr(t, "__name__", None) or type(t).__name__
    cells = [c.cell_contents for c in (getattr(t, "__closure__", None) or ())]
    wrapped = [c for c in cells if isinstance(c, type) and c in BUILTIN_TYPES]
    if "optional" in name.lower() and len(wrapped) == 1:
        return BUILTIN_TYPES[wrapped[0]], True
    return name, False


def describe(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    """Every long option of ``parser`` (without its ``--``; hidden aliases and ``help``
    included, as gpuserve/engine_flags.py has always listed them) -> what argparse knows of
    its value."""
    out: dict[str, dict[str, Any]] = {}
    for option, action in parser._option_string_actions.items():
        if not option.startswith("--"):
            continue
        spec: dict[str, Any] = {}
        if action.nargs == 0:
            spec["switch"] = True
        else:
            if action.nargs is not None:
                spec["nargs"] = action.nargs
            name, none = type_of(action.type)
            if name is not None:
                spec["type"] = name
            if none:
                spec["none"] = True
            if action.choices is not None:
                spec["choices"] = [_json_value(c) for c in action.choices]
            for bound in ("min", "max"):
                value = getattr(action, bound, None)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    spec[bound] = value
        out[option[2:]] = spec
    return dict(sorted(out.items()))


def engine_parser(package: str) -> tuple[argparse.ArgumentParser, str]:
    """The serve parser of the engine installed here, and where it comes from."""
    if package == "sglang":
        from sglang.srt.server_args import ServerArgs

        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        return parser, "sglang.srt.server_args.ServerArgs.add_cli_args"
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for where in VLLM_PARSERS:
        try:
            make = importlib.import_module(where).make_arg_parser
        except ImportError:
            continue
        return make(FlexibleArgumentParser()), f"{where}.make_arg_parser"
    raise SystemExit(f"none of {', '.join(VLLM_PARSERS)} has make_arg_parser in this {package}")


def main(argv: list[str]) -> None:
    parser, source = engine_parser(argv[1])
    print(json.dumps({"parser": source, "flags": describe(parser)}))


if __name__ == "__main__":
    main(sys.argv)
