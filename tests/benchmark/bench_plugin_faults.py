"""Providers that misbehave, for tests/benchmark/test_bench_cli.py (a ``triton-swa bench --plugin``)."""

import os


def _crash(case, x):
    def call():
        os._exit(17)  # as a peer's illegal memory access takes the whole process

    return call


def _wrong(case, x):
    return lambda: x["out"].zero_()


def _partial(case, x):
    """Writes all but the last output row: the NaN left there must fail the check."""
    return lambda: x["out"][:-1].zero_()


PROVIDERS = {"crashes": _crash, "wrong": _wrong, "partial": _partial}


def _hang(case, x):
    def call():
        import time

        time.sleep(600)  # as a kernel that never returns

    return call


PROVIDERS["hangs"] = _hang
