"""deltasync._elements: the node follower's native gather / scatter by flat index."""
import numpy as np
import pytest
import torch

from deltasync import _elements, _native

DTYPES = [torch.uint8, torch.bfloat16, torch.float32, torch.int64]


def _sorted_indices(rng, n, k):
    return np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [0, 1, 1000, 700_000])  # 700k: split over threads
def test_take_and_put_equal_torch(dtype, count):
    rng = np.random.default_rng(count)
    n = 1_500_000
    src = torch.from_numpy(rng.integers(0, 100, n).astype(np.int64)).to(dtype)
    idx = _sorted_indices(rng, n, count)
    vals = _elements.take_elements(src, idx)
    assert torch.equal(vals, src.index_select(0, torch.from_numpy(idx)))
    dst = torch.zeros(n, dtype=dtype)
    want = dst.clone().index_copy_(0, torch.from_numpy(idx), vals)
    _elements.put_elements(dst, torch.from_numpy(idx), vals)
    assert torch.equal(dst, want)


def test_put_with_an_offset_and_a_column_shard_equals_the_reference():
    rng = np.random.default_rng(7)
    rows, cols, k = 300, 1024, 384
    full = torch.from_numpy(rng.standard_normal((rows, cols)).astype(np.float32)).to(torch.bfloat16)
    idx = torch.from_numpy(_sorted_indices(rng, rows * cols, 40_000))
    vals = full.reshape(-1)[idx]
    for c0 in (0, 256, cols - k):  # a row-parallel shard: columns [c0, c0 + k) of every row
        dst = torch.zeros(rows, k, dtype=torch.bfloat16)
        _elements.put_elements(dst.view(-1), idx, vals, cols=cols, c0=c0, k=k)
        mask = torch.zeros(rows * cols, dtype=torch.bool)
        mask[idx] = True
        want = torch.where(mask.view(rows, cols), full, torch.zeros_like(full))[:, c0:c0 + k]
        assert torch.equal(dst, want)
    # rows [100, 200) of the full tensor into a 100-row block: offset = 100 * cols
    sel = idx[(idx >= 100 * cols) & (idx < 200 * cols)]
    block = torch.zeros(100, cols, dtype=torch.bfloat16)
    _elements.put_elements(block.view(-1), sel, full.reshape(-1)[sel], offset=100 * cols)
    assert torch.equal(block.reshape(-1)[sel - 100 * cols], full.reshape(-1)[sel])


def test_an_index_out_of_range_raises_and_writes_nothing():
    src = torch.arange(10, dtype=torch.int64)
    with pytest.raises(IndexError, match="index 10 at position 1"):
        _elements.take_elements(src, np.array([3, 10], dtype=np.int64))
    with pytest.raises(IndexError, match="index -1|index 18446744073709551615"):
        _elements.take_elements(src, np.array([-1], dtype=np.int64))
    dst = torch.zeros(10, dtype=torch.int64)
    for bad in ([2, 10], [5, 3], [4, 4]):  # past the end; not ascending; repeated
        with pytest.raises(IndexError, match="not ascending or fall outside"):
            _elements.put_elements(dst, torch.tensor(bad), torch.tensor([7, 8]))
        assert not dst.any()
    with pytest.raises(IndexError):  # below the offset
        _elements.put_elements(dst, torch.tensor([1, 2]), torch.tensor([7, 8]), offset=2)
    assert not dst.any()
    with pytest.raises(IndexError):  # a column shard whose last row ends past dst: 3 rows of k=4 > 10
        _elements.put_elements(dst, torch.tensor([0, 17]), torch.tensor([7, 8]), cols=8, c0=0, k=4)
    assert not dst.any()


def test_mismatched_arrays_are_refused():
    from deltasync._errors import InvalidArgumentError
    src = torch.zeros(10, dtype=torch.bfloat16)
    with pytest.raises(InvalidArgumentError, match="out must hold 2 elements of 2 bytes"):
        _native.gather_elements(src, np.array([1, 2], dtype=np.int64), torch.zeros(2, dtype=torch.float32), 1)
    with pytest.raises(InvalidArgumentError, match="indices must be int64 or uint64"):
        _native.gather_elements(src, np.array([1, 2], dtype=np.int32), torch.zeros(2, dtype=torch.bfloat16), 1)
    with pytest.raises(InvalidArgumentError, match="columns"):
        _native.scatter_elements(src, np.array([1], dtype=np.int64), torch.zeros(1, dtype=torch.bfloat16),
                                 0, 8, 6, 4, 1)


# Every dtype a replica can hold, F8 and the unsigned ones included: the native calls take no F8 tensor and
# torch has no index_copy_ for F8 and the unsigned dtypes on some devices, so both routes (the native one for
# CPU tensors, torch's for a GPU destination) work on their bit patterns.
EVERY_DTYPE = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2,
               torch.bool, torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.int8, torch.int64]


@pytest.mark.parametrize("dtype", EVERY_DTYPE, ids=str)
def test_the_torch_route_writes_every_dtype_as_the_native_one(dtype):
    rng = np.random.default_rng(3)
    rows, cols, k, c0 = 40, 64, 24, 16
    size = torch.tensor([], dtype=dtype).element_size()
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
    full = torch.from_numpy(rng.integers(0, 256, rows * cols * size, dtype=np.uint8)).view(bits).view(dtype)
    if dtype == torch.bool:
        full = full.view(torch.uint8).remainder(2).to(torch.bool)
    idx = torch.from_numpy(_sorted_indices(rng, rows * cols, 700))
    vals = full.view(bits)[idx].view(dtype)
    for kw, n in (({}, rows * cols), ({"cols": cols, "c0": c0, "k": k}, rows * k)):
        native, route = torch.zeros(n, dtype=dtype), torch.zeros(n, dtype=dtype)
        _elements.put_elements(native, idx, vals, **kw)
        cols_of = kw.get("cols", 1)
        _elements._put_with_torch(route, idx, vals, 0, cols_of, kw.get("c0", 0), kw.get("k", cols_of))
        assert torch.equal(route.view(bits), native.view(bits)), kw
        want = torch.zeros(n, dtype=dtype).view(bits)
        if kw:
            j = idx[(idx % cols >= c0) & (idx % cols < c0 + k)]
            want[(j // cols) * k + j % cols - c0] = full.view(bits)[j]
        else:
            want[idx] = vals.view(bits)
        assert torch.equal(native.view(bits), want), kw
    assert torch.equal(_elements.take_elements(full, idx.numpy()).view(bits), vals.view(bits))
