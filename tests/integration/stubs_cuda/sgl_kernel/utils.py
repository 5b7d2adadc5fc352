"""``sgl_kernel.utils`` of the test stub: only ``is_arch_support_pdl`` is real (SGLang's own)."""


def is_arch_support_pdl() -> bool:
    from sglang.kernels.jit.utils import is_arch_support_pdl as sglang_answer

    return sglang_answer()


def __getattr__(name):
    from . import _Unavailable

    if name.startswith("__"):
        raise AttributeError(name)
    return _Unavailable(f"sgl_kernel.utils.{name}")
