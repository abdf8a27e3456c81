"""File data as users hold it: contiguous netCDF, and many netCDF files (``open_mfdataset``).

Both are read straight from the files by each task (``InputKind.FILE``), so a plan holds one
block per task, not the whole variable (issue 27 item 11, issue 28 item 1).
"""

import dask
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import xarray_memchunk  # noqa: F401  (registers the accessor)
from xarray_memchunk.errors import InfeasiblePlanError
from xarray_memchunk.memory_limits import make_budget
from xarray_memchunk.operators.sources import (
    ConcatenatedReads,
    file_backend,
    input_kind,
    read_chunked,
    reads_own_range,
    reads_serialized,
)
from xarray_memchunk.planning.footprint import InputKind
from xarray_memchunk.testing import watch

YEARS = (2000, 2001, 2002, 2003, 2004)


def _tas(n_time: int, n_lat: int, n_lon: int, start: str, seed: int) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n_time, n_lat, n_lon), dtype="float32")
    return xr.Dataset(
        {"tas": (("time", "lat", "lon"), data)},
        coords={
            "time": pd.date_range(start, periods=n_time, freq="D"),
            "lat": np.linspace(-89.0, 89.0, n_lat),
            "lon": np.linspace(0.0, 358.0, n_lon),
        },
    )


def _yearly_files(root, shape: tuple[int, int], encoding: dict) -> str:
    """Five yearly files ``tas_YYYY.nc`` of (365, *shape) float32; returns their glob."""
    for seed, year in enumerate(YEARS):
        ds = _tas(365, *shape, f"{year}-01-01", seed)
        ds.to_netcdf(root / f"tas_{year}.nc", encoding={"tas": encoding})
    return str(root / "tas_*.nc")


def _yearly_values(shape: tuple[int, int]) -> np.ndarray:
    """What :func:`_yearly_files` wrote, concatenated along time."""
    years = [_tas(365, *shape, f"{y}-01-01", seed).tas.values for seed, y in enumerate(YEARS)]
    return np.concatenate(years)


@pytest.fixture(scope="module")
def contiguous_file(tmp_path_factory):
    """A contiguous (unchunked) netCDF variable of 1460 x 90 x 180 float32 (94.6 MB)."""
    path = tmp_path_factory.mktemp("contiguous") / "tas.nc"
    _tas(1460, 90, 180, "2000-01-01", 0).to_netcdf(path, encoding={"tas": {"contiguous": True}})
    return path


@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    """Five yearly files of (365, 9, 12) in one-day chunks, and the same stored contiguous."""
    root = tmp_path_factory.mktemp("small")
    (root / "chunked").mkdir()
    (root / "contiguous").mkdir()
    return {
        "chunked": _yearly_files(root / "chunked", (9, 12), {"chunksizes": (1, 9, 12)}),
        "contiguous": _yearly_files(root / "contiguous", (9, 12), {"contiguous": True}),
    }


def _watched_median(client, ds: xr.Dataset):
    """Compute memchunk's median over time on ``client``'s cluster, watched: (outcome, result)."""
    computed = {}

    def work():
        computed["median"] = ds.memchunk.apply("median", dim="time").compute()

    return watch(client, "median", work), computed.get("median")


@pytest.mark.parametrize("chunks", [{}, "auto"])
def test_contiguous_netcdf_has_no_storage_chunks_and_plans(contiguous_file, chunks):
    ds = xr.open_dataset(contiguous_file, chunks=chunks)
    assert ds.tas.encoding["contiguous"] is True
    assert input_kind(ds.tas) is InputKind.FILE
    # issue 27 item 11: refused before, as if every task decoded the whole 94.6 MB variable
    plan = ds.memchunk.plan("median", dim="time", memory_limit="600MB")
    assert plan.storage_chunks == {"time": None, "lat": None, "lon": None}
    assert plan.dask_chunks["time"] == (1460,)
    assert plan.n_chunks > 1
    assert plan.predicted_peak_bytes <= plan.budget.per_task


@pytest.mark.cluster
def test_contiguous_median_runs_below_the_variable_without_pause(contiguous_file, cluster_client):
    make, Client = cluster_client
    ds = xr.open_dataset(contiguous_file, chunks={})
    with make("600MB") as cluster, Client(cluster) as client:
        plan = ds.memchunk.plan("median", dim="time")
        outcome, result = _watched_median(client, ds)
    assert outcome.completed, outcome.error
    assert outcome.pauses == 0 and outcome.worker_deaths == 0
    assert outcome.peak_bytes < plan.predicted_peak_bytes + plan.budget.worker_baseline
    xr.testing.assert_equal(result, xr.open_dataset(contiguous_file).median("time"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"parallel": True},
        {"combine": "nested", "concat_dim": "time"},
        {"preprocess": lambda ds: ds},
    ],
    ids=["by-coords", "parallel", "nested", "identity-preprocess"],
)
@pytest.mark.parametrize("storage", ["chunked", "contiguous"])
def test_open_mfdataset_is_read_from_its_files(small_files, storage, kwargs):
    _assert_read_from_files(xr.open_mfdataset(small_files[storage], chunks={}, **kwargs))


@pytest.mark.parametrize("chunks", ["auto", {"time": 100}])
def test_open_mfdataset_in_other_dask_chunks_is_read_from_its_files(small_files, chunks):
    _assert_read_from_files(xr.open_mfdataset(small_files["chunked"], chunks=chunks))


def _assert_read_from_files(ds: xr.Dataset) -> None:
    assert input_kind(ds.tas) is InputKind.FILE
    backend = file_backend(ds.tas.data)
    assert isinstance(backend, ConcatenatedReads)
    assert len(backend.parts) == len(YEARS) and backend.axis == 0
    # blocks across file boundaries, read straight from the files
    planned = {"time": (300, 500, 1000, 25), "lat": (4, 5), "lon": (12,)}
    read = read_chunked(ds.tas, planned)
    assert read.chunks == tuple(planned.values())
    with dask.config.set(scheduler="threads"):
        np.testing.assert_array_equal(read.values, _yearly_values((9, 12)))


def test_files_of_different_lengths_are_read_in_order(tmp_path):
    lengths = {"a": 365, "b": 366, "c": 31}
    start = pd.Timestamp("2000-01-01")
    for seed, (name, n) in enumerate(lengths.items()):
        _tas(n, 3, 4, str(start.date()), seed).to_netcdf(
            tmp_path / f"{name}.nc", encoding={"tas": {"chunksizes": (7, 3, 4)}}
        )
        start += pd.Timedelta(days=n)
    ds = xr.open_mfdataset(str(tmp_path / "*.nc"), chunks={})
    assert [p.shape[0] for p in file_backend(ds.tas.data).parts] == list(lengths.values())
    read = read_chunked(ds.tas, {"time": (364, 3, 395), "lat": (3,), "lon": (4,)})
    with dask.config.set(scheduler="threads"):
        np.testing.assert_array_equal(read.values, ds.tas.values)


@pytest.mark.parametrize(
    "change",
    [
        lambda tas: tas * 2,
        lambda tas: tas.isel(time=slice(10, 400)),
        lambda tas: tas.chunk({"time": 50}),
    ],
    ids=["arithmetic", "selection", "rechunk"],
)
def test_concatenated_files_changed_by_a_graph_stay_graph(small_files, change):
    ds = xr.open_mfdataset(small_files["chunked"], chunks={})
    assert input_kind(change(ds.tas)) is InputKind.GRAPH


def test_preprocess_and_graph_decoding_stay_graph(small_files):
    scaled = xr.open_mfdataset(
        small_files["chunked"], chunks={}, preprocess=lambda ds: ds.assign(tas=ds.tas * 0.5)
    )
    assert input_kind(scaled.tas) is InputKind.GRAPH
    raw = xr.open_mfdataset(
        small_files["chunked"], chunks={}, decode_cf=False, combine="nested", concat_dim="time"
    )
    raw.tas.attrs.update(scale_factor=0.5, add_offset=1.0)
    decoded = xr.decode_cf(raw)
    assert input_kind(decoded.tas) is InputKind.GRAPH


@pytest.mark.parametrize("storage", ["chunked", "contiguous"])
def test_mfdataset_median_plans_below_the_data(small_files, storage):
    ds = xr.open_mfdataset(small_files[storage], chunks={})
    # a per-task budget of about half the data (788 kB): refused before, the concatenation
    # being a graph whose every source chunk a worker was assumed to hold
    budget = make_budget(600_000, 1, 2, "test", worker_baseline=0)
    assert budget.per_task < ds.tas.nbytes / 1.5
    plan = ds.memchunk.plan("median", dim="time", budget=budget)
    assert plan.dask_chunks["time"] == (365 * len(YEARS),)
    assert plan.n_chunks > 1


@pytest.mark.cluster
def test_mfdataset_median_runs_below_the_data_without_pause(tmp_path, cluster_client):
    """Issue 28 item 1 at a small size: 5 yearly files in one-day chunks, 328 MB, on 2 workers
    x 320 MB."""
    pattern = _yearly_files(tmp_path, (150, 300), {"chunksizes": (1, 150, 300)})
    ds = xr.open_mfdataset(pattern, chunks={})
    assert ds.tas.nbytes > 320e6
    plan = ds.memchunk.plan("median", dim="time", memory_limit="320MB")
    assert plan.n_chunks > 1
    make, Client = cluster_client
    with make("320MB") as cluster, Client(cluster) as client:
        outcome, result = _watched_median(client, ds)
    assert outcome.completed, outcome.error
    assert outcome.pauses == 0 and outcome.worker_deaths == 0
    assert outcome.peak_bytes < plan.predicted_peak_bytes + plan.budget.worker_baseline
    xr.testing.assert_equal(result, ds.compute().median("time"))


@pytest.fixture(scope="module")
def one_chunk_files(tmp_path_factory):
    """1500 x 90 x 180 float32 (97 MB) in one storage chunk: stored raw, with zlib, checksummed."""
    root = tmp_path_factory.mktemp("one-chunk")
    ds = _tas(1500, 90, 180, "2000-01-01", 0)
    paths = {}
    for name, extra in {
        "raw": {},
        "zlib": {"zlib": True, "complevel": 1},
        "fletcher32": {"fletcher32": True},
    }.items():
        paths[name] = root / f"{name}.nc"
        ds.to_netcdf(paths[name], encoding={"tas": {"chunksizes": (1500, 90, 180), **extra}})
    return paths


def test_only_unfiltered_netcdf4_chunks_read_their_own_range(
    one_chunk_files, contiguous_file, tmp_path
):
    def opened(path):
        return xr.open_dataset(path, chunks={}).tas

    assert reads_own_range(opened(one_chunk_files["raw"]))
    assert reads_own_range(xr.open_mfdataset([one_chunk_files["raw"]], chunks={}).tas)
    assert reads_own_range(opened(contiguous_file))
    # a filter decodes the chunk whole, whatever part is read
    assert not reads_own_range(opened(one_chunk_files["zlib"]))
    assert not reads_own_range(opened(one_chunk_files["fletcher32"]))
    # Zarr decodes whole chunks, compressed or not; a graph is not a file read
    xr.open_dataset(one_chunk_files["raw"]).to_zarr(
        tmp_path / "raw.zarr", encoding={"tas": {"compressors": None}}
    )
    assert not reads_own_range(xr.open_zarr(tmp_path / "raw.zarr").tas)
    assert not reads_own_range(opened(one_chunk_files["raw"]) * 2)


def test_a_large_unfiltered_chunk_is_not_decoded_whole(one_chunk_files):
    """Trial 78: a 97 MB storage chunk, 4 threads of 1 GB (128 MiB a task). Compressed, and
    read without xarray's lock, 3 x the chunk per task does not fit; stored raw, each task reads
    its own range."""
    budget = make_budget(1_000_000_000, 4, 1, "test")  # 1 worker x 4 threads x 1 GB
    raw = xr.open_dataset(one_chunk_files["raw"], chunks={})
    plan = raw.memchunk.plan("sum", dim="time", budget=budget)
    assert plan.n_chunks > 1
    assert plan.predicted_peak_bytes <= plan.budget.per_task
    zlib = xr.open_dataset(one_chunk_files["zlib"], chunks={}, lock=False)
    assert not reads_serialized(zlib.tas)
    with pytest.raises(InfeasiblePlanError, match="at least"):
        zlib.memchunk.plan("sum", dim="time", budget=budget)


@pytest.mark.cluster
@pytest.mark.parametrize("storage", ["raw", "zlib"])
def test_a_large_chunk_sums_without_pause_on_four_threads(
    one_chunk_files, storage, quiet_distributed
):
    """Stored raw, each task reads its own range; compressed, under xarray's lock (its default
    for netCDF4), one task at a time decodes the chunk, and the 4 slots share its copies."""
    from distributed import Client, LocalCluster

    ds = xr.open_dataset(one_chunk_files[storage], chunks={})
    assert reads_serialized(ds.tas)
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=4, memory_limit="1GB", dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        plan = ds.memchunk.plan("sum", dim="time")
        computed = {}
        outcome = watch(client, "sum", lambda: computed.update(sum=plan.apply().compute()))
    assert plan.n_chunks > 1
    assert outcome.completed, outcome.error
    assert outcome.pauses == 0 and outcome.worker_deaths == 0
    assert outcome.peak_bytes < plan.predicted_peak_bytes * 4 + plan.budget.worker_baseline
    expected = xr.open_dataset(one_chunk_files[storage]).sum("time")
    xr.testing.assert_allclose(computed["sum"], expected)
