"""SWA pools are recognised by what they are or expose (docs/contract.md §3), never by identity with our class."""

from types import SimpleNamespace

import pytest
import torch

from triton_swa.mem import SWA_POOL_PROTOCOL, MHATokenToKVPool, SWAKVPool, is_swa_kv_pool

pytestmark = pytest.mark.reference


class ForeignSWAPool:
    """An engine's own SWA pool: no relation to triton-swa's classes, only the protocol."""

    def __init__(self, inner: SWAKVPool):
        self._inner = inner
        self.swa_kv_pool, self.full_kv_pool = inner.swa_kv_pool, inner.full_kv_pool
        self.layers_mapping = dict(inner.layers_mapping)
        self.page_size = inner.page_size

    @property
    def full_to_swa_index_mapping(self):
        return self._inner.full_to_swa_index_mapping

    def register_mapping(self, mapping):
        self._inner.register_mapping(mapping)

    def translate_loc_from_full_to_swa(self, loc):
        return self._inner.translate_loc_from_full_to_swa(loc)

    def get_kv_buffer(self, layer_id):
        return self._inner.get_kv_buffer(layer_id)


def _ours():
    return SWAKVPool(16, 8, 1, torch.float32, [0], [1], head_num=1, head_dim=8)


def test_our_pool_a_foreign_pool_and_plain_pools():
    assert is_swa_kv_pool(_ours())
    foreign = ForeignSWAPool(_ours())
    assert not isinstance(foreign, SWAKVPool) and is_swa_kv_pool(foreign)
    assert not is_swa_kv_pool(MHATokenToKVPool(16, 1, torch.float32, 1, 8, 2))
    assert not is_swa_kv_pool(None) and not is_swa_kv_pool(object())


@pytest.mark.parametrize("missing", SWA_POOL_PROTOCOL)
def test_a_partial_protocol_cannot_be_classified(missing):
    attrs = {name: object() for name in SWA_POOL_PROTOCOL}
    attrs["layers_mapping"], attrs["translate_loc_from_full_to_swa"] = {0: (0, True)}, lambda loc: loc
    del attrs[missing]
    with pytest.raises(ValueError, match=f"{missing} is missing"):
        is_swa_kv_pool(SimpleNamespace(**attrs))


def test_a_mock_like_pool_with_a_non_mapping_layers_mapping_raises():
    attrs = {name: object() for name in SWA_POOL_PROTOCOL}
    with pytest.raises(ValueError, match="layers_mapping is a object, not a mapping"):
        is_swa_kv_pool(SimpleNamespace(**attrs))
