"""The command line: ``triton-swa demo`` (also ``python -m triton_swa demo``)."""

from __future__ import annotations

import sys

_USAGE = """usage: triton-swa COMMAND [options]

commands:
  demo    serve a tiny Gemma-4-style model with speculative decoding through triton-swa, with the
          pool-resolution policy of docs/contract.md §3 and with the rule it replaced on the draft worker, side by side
          (triton-swa demo --help)
  bench   the op benchmarks on this machine's GPU: decode, prefill and verify on model-like shapes,
          every provider checked against a float64 reference before it is timed (triton-swa bench --help)
"""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE, end="")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "demo":
        from .demo import main as demo

        return demo(rest)
    if command == "bench":
        from .benchmark import main as bench

        return bench(rest)
    print(f"triton-swa: unknown command {command!r}\n\n{_USAGE}", end="", file=sys.stderr)
    return 2
