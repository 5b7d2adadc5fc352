"""``TRITON_SWA`` in vLLM's attention registry: :func:`register`, called by vLLM's
``vllm.general_plugins`` entry point (pyproject.toml) in the engine and in every worker.

Registration, and the traps it avoids:

- The name is registered with its class path (``register_backend("TRITON_SWA", path)``): without a
  path the new member's value would be ``""``, which is ``TORCH_SDPA``'s value.
- Registering a name twice raises in vLLM: :func:`register` is idempotent (the member is reused when
  it already points at this backend) and raises a ``RuntimeError`` naming the other class path when
  ``TRITON_SWA`` was taken by someone else.
- Enum members pickle by value, so a name-registered member does not unpickle in a spawned worker
  that has not loaded its plugins yet. The ``TRITON_SWA`` member pickles as a call to
  :func:`_backend_member`, which imports this module and registers first. ``CUSTOM`` (value None)
  unpickles anywhere; its class path is restored when the worker loads its plugins.
"""

from __future__ import annotations

BACKEND_NAME = "TRITON_SWA"
# where vLLM's registry finds the backend class: the package, which imports it on first access
CLASS_PATH = f"{__package__}.TritonSWABackend"


def register() -> None:
    """Register ``TRITON_SWA`` in vLLM's attention registry (and ``CUSTOM`` when it is free).

    Idempotent; vLLM's ``vllm.general_plugins`` entry point calls it in every process.

    Raises:
        RuntimeError: ``TRITON_SWA`` is already registered with another class path.
    """
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    member = AttentionBackendEnum.__members__.get(BACKEND_NAME)
    if member is None:
        register_backend(BACKEND_NAME, CLASS_PATH)
        member = AttentionBackendEnum[BACKEND_NAME]
    else:
        path = member.get_path() if member.value or member.is_overridden() else member.value
        if path != CLASS_PATH:
            raise RuntimeError(
                f"vLLM attention backend {BACKEND_NAME} is already registered with class path {path!r}, not {CLASS_PATH!r}: "
                "another plugin uses the name"
            )
        register_backend(member, CLASS_PATH)
    # Pickle by name through this module (see the module docstring): a spawned worker that unpickles
    # the member before loading its plugins registers it first.
    member.__reduce_ex__ = _member_reduce
    custom = AttentionBackendEnum.CUSTOM
    if not custom.is_overridden():
        register_backend(custom, CLASS_PATH)


def _member_reduce(protocol=None):
    return (_backend_member, ())


def _backend_member():
    """The ``TRITON_SWA`` member of vLLM's ``AttentionBackendEnum``, registered first if needed."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    register()
    return AttentionBackendEnum[BACKEND_NAME]
