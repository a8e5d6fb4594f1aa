"""Regenerate the SGLang CLI snapshot from an SGLang wheel, without importing SGLang.

SGLang declares its launch flags as annotated msgspec fields (``arg_groups/fields/*.py``)
plus a few hand-registered ones in ``server_args.py``. Importing them needs torch and a GPU
stack, so we read them statically (AST) and keep the result as JSON next to this file:

    pip download sglang==0.5.23 --no-deps -d /tmp/sg && (cd /tmp/sg && unzip -q sglang-*.whl)
    python -m dspark_ci.ground.sglang.extract_flags /tmp/sg 0.5.23
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

HERE = Path(__file__).parent


def _const(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None


def _type_kind(type_node: ast.AST, arg_kwargs: dict) -> str:
    """'bool' (store_true), 'list' (nargs '+') or 'value', as SGLang's add_cli_args_from_dataclass decides."""
    if "action" in arg_kwargs:
        action = ast.unparse(arg_kwargs["action"])
        return "optional_bool" if "BooleanOptionalAction" in action else "value"
    text = ast.unparse(type_node)
    inner = text.removeprefix("Optional[").removesuffix("]") if text.startswith("Optional[") else text
    if inner == "bool":
        return "bool"
    if (inner.startswith(("List[", "list[")) and "type_parser" not in arg_kwargs) or "nargs" in arg_kwargs:
        return "list"
    return "value"


def _field_flags(tree: ast.Module) -> dict:
    flags = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            ann = stmt.annotation
            if not (isinstance(ann, ast.Subscript) and ast.unparse(ann.value) == "A"):
                continue
            elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            if len(elts) < 2:
                continue
            meta = elts[1]
            kwargs = {}
            if isinstance(meta, ast.Call) and ast.unparse(meta.func) == "Arg":
                kwargs = {k.arg: k.value for k in meta.keywords if k.arg}
                if _const(kwargs.get("no_cli", ast.Constant(False))):
                    continue
            name = stmt.target.id
            cli = _const(kwargs["cli_name"]) if "cli_name" in kwargs else "--" + name.replace("_", "-")
            choices = _const(kwargs["choices"]) if "choices" in kwargs else None
            literal = ast.unparse(elts[0])
            if choices is None and "Literal[" in literal:
                sub = ast.parse(literal, mode="eval").body
                while isinstance(sub, ast.Subscript) and ast.unparse(sub.value) != "Literal":
                    sub = sub.slice
                if isinstance(sub, ast.Subscript):
                    vals = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
                    choices = [_const(v) for v in vals]
            flags[cli] = {
                "dest": name,
                "kind": _type_kind(elts[0], kwargs),
                "aliases": _const(kwargs["aliases"]) if "aliases" in kwargs else [],
                "choices": list(choices) if isinstance(choices, (list, tuple)) else None,
            }
    return flags


def _manual_flags(tree: ast.Module) -> dict:
    """``parser.add_argument(...)`` calls in server_args.py (deprecated and dynamic-choice flags)."""
    flags = {}
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "parser.add_argument"):
            continue
        names = [_const(a) for a in call.args if isinstance(_const(a), str)]
        if not names:
            continue
        kw = {k.arg: k.value for k in call.keywords if k.arg}
        action = ast.unparse(kw["action"]) if "action" in kw else ""
        kind = "bool" if ("StoreTrue" in action or "store_true" in action) else "value"
        flags[names[0]] = {
            "dest": _const(kw["dest"]) if "dest" in kw else names[0].lstrip("-").replace("-", "_"),
            "kind": kind,
            "aliases": names[1:],
            "choices": None,  # dynamic in SGLang (parsers registered at import time)
        }
    return flags


def extract(sglang_root: Path) -> dict:
    srt = sglang_root / "sglang" / "srt"
    flags = {}
    for path in sorted((srt / "arg_groups" / "fields").glob("*.py")):
        flags.update(_field_flags(ast.parse(path.read_text())))
    flags.update(_manual_flags(ast.parse((srt / "server_args.py").read_text())))
    return dict(sorted(flags.items()))


def main(argv: list[str]) -> int:
    root, version = Path(argv[0]), argv[1]
    out = HERE / f"flags-{version}.json"
    out.write_text(json.dumps({"sglang": version, "flags": extract(root)}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
