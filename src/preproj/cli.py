"""The `preproj` command line: one subcommand per job."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from .adapter import write_json


def _add_dataclass_args(parser: argparse.ArgumentParser, cls) -> None:
    """One --flag per dataclass field; the help text is the field's docstring (litgpt-style)."""
    docs = _field_docs(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, type=type(f.default), default=f.default, help=f"{docs.get(f.name, '')} (default: {f.default})")


def _field_docs(cls) -> dict[str, str]:
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = str(nxt.value.value)
    return docs


def _inspect(ns: argparse.Namespace) -> int:
    from .inspection import InspectArgs, format_report, inspect_model
    from .loading import load_model

    args = InspectArgs(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(InspectArgs)})
    start = time.monotonic()
    print(f"loading {args.model} ...", file=sys.stderr)
    model, tokenizer = load_model(args.model)
    print(f"measuring (K/V cache at {args.context} tokens, greedy samples) ...", file=sys.stderr)
    report = inspect_model(model, tokenizer, args)
    print(format_report(report))
    if ns.out:
        write_json(ns.out, report)
        print(f"\nwrote {ns.out}")
    kv = report["kv_cache"]
    print(f"\nsummary: {report['added']['total'] / 1e6:.1f}M parameters added "
          f"({report['added']['percent_of_total']:.1f}%), K/V cache ratio {kv['ratio']:.3f}, "
          f"{time.monotonic() - start:.0f}s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .inspection import InspectArgs

    parser = argparse.ArgumentParser(prog="preproj", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="Where the modules sit, parameters added, K/V cache cost, greedy samples.")
    _add_dataclass_args(p, InspectArgs)
    p.add_argument("--out", default=None, help="Also write the report as JSON to this path.")
    p.set_defaults(run=_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .adapter import AdapterError
    from .loading import ModelLoadError

    ns = build_parser().parse_args(argv)
    try:
        return ns.run(ns)
    except (ModelLoadError, AdapterError, ValueError) as e:
        print(f"preproj {ns.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
