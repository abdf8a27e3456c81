"""A user's function: its identity, its arguments, what it returns and its name (issue 27)."""

import functools
import threading

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk.operators import get_operator
from xarray_memchunk.units import to_bytes

MODEL = xm.LinearMemoryModel({"input_bytes": 3.0, "output_bytes": 1.0})


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(tmp_path))
    return tmp_path


def make(k):
    @xm.operator(name="stacked", register=False)
    def stacked(b):
        return np.stack([b] * k).sum(0)

    return stacked


class Filt:
    def __init__(self, k):
        self.k = k

    def run(self, block):
        return block * self.k


def mul(block, factor=1):
    return block * factor


def bytes_per_element(plan):
    return plan.predicted_task_bytes / np.prod(list(plan.chunks.values()))


def field(shape=(40, 30), chunks=(10, 30), dtype="float32"):
    data = da.ones(shape, chunks=chunks, dtype=dtype)
    return xr.DataArray(data, dims=("y", "x"), name="f")


def key(func):
    return xm.BlockwiseOperator("f", func).calibration


def test_the_key_covers_closures_bound_state_defaults_and_lambdas():
    assert make(1).calibration != make(30).calibration
    assert key(Filt(4).run) != key(Filt(5).run)
    plus, times = (lambda b: b + 1), (lambda b: b + 1)  # the same code, two places
    assert key(plus) != key(times)
    assert key(functools.partial(mul, factor=2)) != key(functools.partial(mul, factor=3))

    def scaled(block, k=1):
        return block * k

    before = key(scaled)
    scaled.__defaults__ = (2,)
    assert key(scaled) != before


def test_the_same_function_defined_again_keeps_its_key():
    first = make(4)
    first.func(np.ones((50, 50)))  # running it (specialised bytecode) changes nothing
    assert make(4).calibration == first.calibration
    assert key(Filt(4).run) == key(Filt(4).run)
    assert first.identity_known and first.identity_reason == ""


def test_a_line_added_above_a_function_keeps_its_key(tmp_path):
    """A trial: one comment line at the top of a script lost what runs taught its function."""
    source = "import numpy as np\n\ndef neg_fix(block):\n    return np.abs(block) + 1\n"
    funcs = []
    for extra in ("", "# a comment\n\n\n"):
        namespace = {"__name__": "__main__"}
        exec(compile(extra + source, str(tmp_path / "script.py"), "exec"), namespace)
        funcs.append(namespace["neg_fix"])
    assert funcs[0].__code__.co_firstlineno != funcs[1].__code__.co_firstlineno
    assert key(funcs[0]) == key(funcs[1])
    namespace = {"__name__": "__main__"}
    exec(compile(source.replace("+ 1", "+ 2"), str(tmp_path / "script.py"), "exec"), namespace)
    assert key(namespace["neg_fix"]) != key(funcs[0])


def test_an_identity_that_cannot_be_hashed_is_unknown_and_never_shared():
    lock = threading.Lock()

    def guarded(block):
        with lock:
            return block + 1

    one, two = xm.BlockwiseOperator("g", guarded), xm.BlockwiseOperator("g", guarded)
    assert not one.identity_known and "lock" in one.identity_reason
    assert one.cost(field()).identity_doubt == one.identity_reason
    assert one.calibration != two.calibration
    assert make(2).cost(field(), factor=2).identity_doubt == ""
    assert "lock" in make(2).cost(field(), guard=lock).identity_doubt


def test_keyword_arguments_are_part_of_the_key():
    op = xm.BlockwiseOperator("mul", mul)

    def key_of(data=None, **kwargs):
        return op.cost(field() if data is None else data, **kwargs).calibration_key

    assert key_of(factor=2) != key_of(factor=30)
    assert key_of(factor=2) == key_of(factor=2)
    assert key_of() == op.calibration
    weights = np.arange(4.0)
    by_content = key_of(factor=weights)
    assert by_content == key_of(factor=weights.copy())
    assert by_content != key_of(factor=weights + 1)
    other = field((8, 4), (4, 4), "float64")  # the key is the function's, whatever the data
    assert key_of(other, factor=2) == key_of(factor=2)


def test_arguments_the_function_does_not_take_are_refused_before_it_runs():
    calls = []

    def counted(block, factor=1):
        calls.append(block.shape)
        return block * factor

    op = xm.BlockwiseOperator("counted", counted, memory_model=MODEL)
    with pytest.raises(xm.MemchunkError, match=r"counted\(block, bogus=...\).*'bogus'"):
        field().memchunk.plan(op, memory_limit="1GB", bogus=5)

    def needs(block, factor):
        return block * factor

    with pytest.raises(xm.MemchunkError, match="missing a required argument: 'factor'"):
        field().memchunk.apply(xm.BlockwiseOperator("needs", needs, memory_model=MODEL))
    assert calls == []
    with_kwargs = xm.BlockwiseOperator("any", lambda b, **kw: b, memory_model=MODEL)
    assert with_kwargs.check_arguments({"anything": 1}) == {"anything": 1}


def returns_a_list(block):
    return block.tolist()


def returns_a_scalar(block):
    return float(block.sum())


def returns_nothing(block):
    block.sum()


def returns_a_row(block):
    return block[0]


def returns_a_numpy_scalar(block):
    return block.sum()


def test_a_function_of_blocks_is_never_called_on_objects():
    """A new user's detrend was called on a Dataset's cftime time_bnds, and its probe failed
    with "returned a object array of shape (8, 8, 2) for a object block of shape (8, 2)"."""
    dtypes = []

    def doubled(block):
        dtypes.append(block.dtype)
        return block * 2

    ds = (
        field()
        .to_dataset()
        .assign(labels=(("y",), np.array([f"row {i}" for i in range(40)], dtype=object)))
    )
    ds["labels"] = ds.labels.chunk()
    op = xm.BlockwiseOperator("doubled", doubled, memory_model=MODEL)
    plan = ds.memchunk.plan(op, memory_limit="1GB")
    (note,) = [n for n in plan.notes if n.startswith("not planned: labels")]
    assert "does not compute on dtype object" in note
    assert dtypes and all(d.kind != "O" for d in dtypes)
    assert list(plan.apply().data_vars) == ["f"]


@pytest.mark.parametrize(
    ("func", "returned"),
    [
        (returns_a_list, "returned a list"),
        (returns_a_scalar, "returned a float"),
        (returns_nothing, r"returned None \(does it lack a return statement\?\)"),
        (returns_a_row, r"returned a float32 array of shape \(8,\)"),
        (returns_a_numpy_scalar, r"returned a scalar \(float32\)"),
    ],
)
def test_a_function_returning_no_block_is_refused_before_compute(func, returned):
    op = xm.BlockwiseOperator("bad", func, memory_model=MODEL)
    message = rf"function '{func.__name__}' {returned} .* must return an array of shape \(8, 8\)"
    with pytest.raises(xm.MemchunkError, match=message):
        field().memchunk.plan(op, memory_limit="1GB")


def test_a_wrong_block_at_compute_is_a_clear_error(threaded):
    def small_blocks_only(block):  # right on the probe, wrong on the planned blocks
        return block if block.size <= 64 else block[:1]

    op = xm.BlockwiseOperator("small-only", small_blocks_only, memory_model=MODEL)
    lazy = field().memchunk.apply(op, memory_limit="1GB")
    with pytest.raises(xm.MemchunkError, match=r"'small_blocks_only' returned .* shape \(1, 30\)"):
        lazy.compute()


def test_an_operator_from_a_partial_is_named_after_its_function(threaded):
    op = xm.operator(register=False, memory_model=MODEL)(functools.partial(mul, factor=3))
    assert op.name == "mul"
    np.testing.assert_array_equal(field().memchunk.apply(op, memory_limit="1GB").values, 3.0)

    class Nameless:
        def __call__(self, block):
            return block

    with pytest.raises(xm.MemchunkError, match=r"operator\(name=\.\.\.\)"):
        xm.operator(register=False, memory_model=MODEL)(Nameless())


def test_a_user_operator_never_replaces_a_built_in_one():
    mean = get_operator("mean")
    with pytest.raises(xm.MemchunkError, match="'mean' is the name of a built-in operator"):
        xm.operator(name="mean", memory_model=MODEL)(mul)
    with pytest.raises(xm.MemchunkError, match="give yours another name"):
        xm.register_operator(xm.BlockwiseOperator("gst3d", mul), overwrite=True)
    assert get_operator("mean") is mean and type(get_operator("gst3d")).__name__ == "GST3D"
    xm.register_operator(mean, overwrite=True)  # the built-in itself: nothing changes
    first = xm.operator(name="test-user-mul", memory_model=MODEL)(mul)
    again = xm.operator(name="test-user-mul", memory_model=MODEL)(mul)  # a re-run cell
    assert get_operator("test-user-mul") is again is not first


def test_the_lazy_dtype_is_the_computed_one(threaded):
    signs = xm.BlockwiseOperator("signs", lambda b: (b > 0).astype("int8"), memory_model=MODEL)
    lazy = field().memchunk.apply(signs, memory_limit="1GB")
    assert lazy.dtype == np.int8 and lazy.compute().dtype == np.int8
    widened = xm.BlockwiseOperator(
        "widened", lambda b: b.astype("float64"), memory_model=MODEL, dtype="float32"
    )
    lazy = field().memchunk.apply(widened, memory_limit="1GB")
    assert lazy.dtype == np.float32
    assert lazy.data.blocks[0, 0].compute().dtype == np.float32
    counts = xm.BlockwiseOperator(
        "counts", lambda b: (b > 0).sum(axis=0), memory_model=MODEL, drop_dims=("y",)
    )
    lazy = field().memchunk.apply(counts, memory_limit="1GB")
    assert lazy.dtype == lazy.compute().dtype == np.dtype(int)
    in_memory = field().compute().memchunk.apply(signs, memory_limit="1GB")
    assert in_memory.dtype == np.int8


@pytest.mark.cluster
def test_a_closure_over_more_copies_is_measured_again(user_dir, quiet_distributed):
    """The issue's reproduction, smaller: s30 planned with s1's model paused workers."""
    from distributed import Client, LocalCluster

    from xarray_memchunk.testing import run_watched

    s1, s30 = make(1), make(30)
    data = xr.DataArray(
        da.random.default_rng(0).random((4000, 4000), chunks=(250, 4000)), dims=("y", "x")
    )
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 1}),
        LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit="800MB", dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        small = data.memchunk.plan(s1)
        plan = data.memchunk.plan(s30)
        assert len(list(user_dir.glob("stacked-*-cpu.json"))) == 2  # each measured itself
        assert bytes_per_element(plan) > 5 * bytes_per_element(small)  # 30 copies, not 1
        outcome = run_watched(client, "s30", lambda: data.memchunk.apply(s30).data.sum())
    assert outcome.completed, outcome.error
    assert outcome.pauses == 0 and outcome.worker_deaths == 0
    assert outcome.peak_bytes < 0.8 * to_bytes("800MB")


def scaled(block, table=None):
    return block * table[0]


@pytest.mark.parametrize("halo", [{}, {"x": 2}])
def test_a_large_argument_is_in_the_graph_once_and_a_small_one_keeps_tasks_fused(halo, threaded):
    """A 400 kB argument, copied into each of the operator's tasks, was received and unpickled
    by the workers once per task; a small one stays in the tasks, which Dask then fuses with
    the task that made their block (a key among a task's dependencies stops that)."""
    import cloudpickle

    op = xm.operator(name="scaled", depth=halo, memory_model=MODEL, register=False)(scaled)
    data = xr.DataArray(da.ones((40, 400), chunks=(10, 400)), dims=("x", "y")) * 2
    large = np.full(50_000, 3.0)
    result = data.memchunk.apply(op, memory_limit="1GB", chunks={"x": 10}, table=large)
    sizes = [len(cloudpickle.dumps(t)) for t in dict(result.data.dask).values()]
    assert sum(size > large.nbytes / 2 for size in sizes) == 1  # the argument's key
    np.testing.assert_array_equal(result.values, 6.0)

    small = data.memchunk.apply(op, memory_limit="1GB", chunks={"x": 10}, table=large[:10])
    if not halo:  # made, doubled and scaled in one task per block
        (optimized,) = dask.optimize(small.data)
        keys = list(dict(optimized.dask))
        assert len(keys) == 4 and all("scaled" in str(key[0]) for key in keys)
    np.testing.assert_array_equal(small.values, 6.0)


def add_table(block, table=None):
    return block + table[0]


@pytest.mark.parametrize("table", [np.arange(10.0), da.arange(10.0, chunks=5)])
def test_a_function_measured_with_an_array_argument_saves_its_calibration(user_dir, table):
    """A new user's first plan of a function given a lookup table failed with "Object of type
    ndarray is not JSON serializable" (the calibration file names the arguments)."""
    import json

    op = xm.operator(name="add_table", depth={"x": 1}, register=False)(add_table)
    data = xr.DataArray(da.ones((200, 200), chunks=100, dtype="float32"), dims=("x", "y"))
    with dask.config.set({"memchunk.self-calibration-seconds": 1}):
        plan = data.memchunk.plan(op, memory_limit="1GB", table=table)
    (saved,) = user_dir.glob("add_table-*-cpu.json")
    described = json.loads(saved.read_text())["operator_kwargs"]["table"]
    assert described == f"{type(table).__name__} of float64, shape (10,)"
    np.testing.assert_array_equal(plan.apply().values, 1.0)
