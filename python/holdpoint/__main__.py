"""python -m holdpoint inspect|verify FILE, diff A B: the CLI's read-only commands, for pip users."""

from __future__ import annotations

import argparse
import json
import sys

from . import Error, _native, diff, inspect, verify
from ._convert import TensorInfo


def _print_tree(node, label: str, depth: int, out) -> None:
    pad = "  " * depth
    if isinstance(node, TensorInfo):
        extra = " (NumPy array)" if node.get("numpy") else ""
        out.write(f"{pad}{label}Tensor {node['dtype']} {list(node['shape'])}{extra}\n")
    elif isinstance(node, dict):
        out.write(f"{pad}{label}{type(node).__name__} ({len(node)} keys)\n")
        for i, (key, value) in enumerate(node.items()):
            if i == 20:
                out.write(f"{pad}  ... {len(node) - 20} more\n")
                break
            _print_tree(value, f"{key!r}: ", depth + 1, out)
    elif isinstance(node, (list, tuple)):
        out.write(f"{pad}{label}{type(node).__name__} ({len(node)} items)\n")
        for i, value in enumerate(node[:8]):
            _print_tree(value, f"[{i}] ", depth + 1, out)
        if len(node) > 8:
            out.write(f"{pad}  ... {len(node) - 8} more\n")
    else:
        text = repr(node)
        out.write(f"{pad}{label}{text if len(text) <= 80 else text[:77] + '...'}\n")


def _jsonable(node):
    if isinstance(node, dict):
        return {str(k): _jsonable(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_jsonable(v) for v in node]
    if isinstance(node, bytes):
        return {"bytes": node.hex()}
    return node


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m holdpoint", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("inspect", "verify"):
        command = commands.add_parser(name)
        command.add_argument("file")
        command.add_argument("--sha256", help="expected SHA-256 (64 hex digits) from a trusted source")
        command.add_argument("--json", action="store_true", help="print JSON")
        if name == "verify":
            command.add_argument("--sidecar", action="store_true", help="check FILE against FILE.sha256")
    compare = commands.add_parser("diff", help="compare two checkpoint files tensor by tensor (exit 0 same, "
                                                  "1 different, 2 error)")
    compare.add_argument("a")
    compare.add_argument("b")
    compare.add_argument("--atol", type=float, default=0.0)
    compare.add_argument("--rtol", type=float, default=0.0)
    compare.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    if args.command == "diff":
        try:
            report = diff(args.a, args.b, atol=args.atol, rtol=args.rtol)
        except Error as error:
            if args.json:
                print(json.dumps({"code": error.code, "message": str(error)}, indent=2))
            else:
                print(f"error: {error.code}: {error}")
            return 2
        if args.json:
            text = report.pop("text")
            print(json.dumps(report, indent=2))
            report["text"] = text
        else:
            print(report["text"], end="" if report["text"].endswith("\n") else "\n")
        return 0 if report["same"] else 1
    try:
        if args.command == "verify":
            report = verify(args.file, expected_sha256=args.sha256, sidecar=args.sidecar)
            if args.json:
                print(json.dumps(report, indent=2))
            else:
                checked = ", digest matches" if report["digest_checked"] else ""
                print(f"valid: {args.file} ({report['format']}, sha256 {report['sha256']}{checked})")
            return 0
        info = inspect(args.file, expected_sha256=args.sha256)
        if args.json:
            print(json.dumps(_jsonable(info), indent=2))
        else:
            print(f"{args.file}: {info['format']}, {info['bytes']} bytes, sha256 {info['sha256']}")
            _print_tree(info["tree"], "", 0, sys.stdout)
        return 0
    except Error as error:
        # As the C++ CLI: 2 for the environment or the call, 1 for the file's content.
        environment = _native.is_environment_error(error.code)
        if args.json:
            print(json.dumps({"valid": False, "code": error.code, "message": str(error)}, indent=2))
        else:
            print(f"{'error' if environment else 'invalid'}: {error.code}: {error}")
        return 2 if environment else 1


if __name__ == "__main__":
    sys.exit(main())
