"""Zarr / netCDF end to end, safe writes, and the memchunk command line through subprocess."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk.datasets import synthetic_climate, synthetic_seismic

MEMCHUNK = [sys.executable, "-m", "xarray_memchunk.cli"]


def memchunk(*args, timeout=300):
    return subprocess.run(
        [*MEMCHUNK, *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    volume = synthetic_seismic((48, 40, 36), dip_degrees=15)
    volume.chunk({"inline": 12, "crossline": 20, "sample": 36}).to_zarr(root / "volume.zarr")
    climate = synthetic_climate(120, 18, 24)
    climate.to_netcdf(root / "tas.nc", encoding={"tas": {"chunksizes": (10, 18, 24)}})
    (root / "notes.txt").write_text("not a dataset\n")
    return root


def test_open_keeps_storage_chunks_and_plan_aligns(files):
    ds = xr.open_zarr(files / "volume.zarr")
    plan = ds.memchunk.plan("gst3d", memory_limit="1GB")
    assert plan.storage_chunks == {"inline": 12, "crossline": 20, "sample": 36}
    assert plan.storage_aligned
    assert all(c % 12 == 0 for c in plan.dask_chunks["inline"][:-1])
    nc = xr.open_dataset(files / "tas.nc", chunks={})
    assert nc.memchunk.plan("median", dim="T", memory_limit="1GB").storage_chunks["time"] == 10


def test_accessor_writes_zarr_and_netcdf_with_plan_chunks(files, tmp_path, threaded):
    ds = xr.open_zarr(files / "volume.zarr")
    dip = ds.memchunk.apply("gst3d", memory_limit="1GB")
    out = dip.memchunk.to_zarr(tmp_path / "dip.zarr")
    back = xr.open_zarr(out)
    plan = ds.memchunk.plan("gst3d", memory_limit="1GB")
    assert back.dip.encoding["chunks"] == tuple(plan.chunks[d] for d in back.dip.dims)
    np.testing.assert_array_equal(back.dip.values, ds.load().memchunk.apply("gst3d").dip.values)
    nc = dip.memchunk.to_netcdf(tmp_path / "dip.nc")
    assert xr.open_dataset(nc).dip.encoding["chunksizes"] == back.dip.encoding["chunks"]
    with pytest.raises(xm.MemchunkError, match="exists"):
        dip.memchunk.to_zarr(tmp_path / "dip.zarr")
    assert [p.name for p in tmp_path.iterdir() if "memchunk-" in p.name] == []


def test_cli_plan_prints_the_plan(files):
    result = memchunk("plan", "gst3d", files / "volume.zarr", "--memory-limit", "1.5GB")
    assert result.returncode == 0, result.stderr
    assert "predicted peak per task" in result.stdout and "storage chunks" in result.stdout
    result = memchunk("plan", "median", files / "tas.nc", "--dim", "T", "--memory-limit", "1GB")
    assert result.returncode == 0, result.stderr
    assert "whole dims" in result.stdout and "time" in result.stdout


def test_cli_run_writes_netcdf_and_refuses_to_overwrite(files, tmp_path):
    target = tmp_path / "median.nc"
    args = [
        "run",
        "median",
        files / "tas.nc",
        target,
        "--dim",
        "T",
        "--nworkers",
        "1",
        "--memory-limit",
        "1GB",
    ]
    result = memchunk(*args)
    assert result.returncode == 0, result.stderr
    written = xr.open_dataset(target)
    expected = xr.open_dataset(files / "tas.nc").tas.median("time")
    np.testing.assert_allclose(written.tas.values, expected.values, rtol=1e-6)
    again = memchunk(*args)
    assert again.returncode == 2 and "exists" in again.stderr
    assert "--overwrite" in again.stderr
    assert memchunk(*args, "--overwrite").returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "gst3d", "{root}/missing.zarr"], "does not exist"),
        (["plan", "gst3d", "{root}/notes.txt"], "cannot open"),
        (["plan", "gst3d", "{root}/volume.zarr", "--var", "velocity"], "no variable 'velocity'"),
        (["plan", "gst3d-typo", "{root}/volume.zarr"], "unknown operator"),
        (["plan", "median", "{root}/volume.zarr", "--dim", "T"], "no dim 'T'"),
        (
            ["plan", "gst3d", "{root}/volume.zarr", "--memory-limit", "lots"],
            "cannot parse memory_limit",
        ),
        (["run", "gst3d", "{root}/volume.zarr", "{root}/tas.nc"], "exists"),
        (["plan", "gst3d", "{root}/volume.zarr", "-o", "sigma"], "KEY=VALUE"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(files, args, message):
    result = memchunk(*[a.format(root=files) for a in args])
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_killed_run_leaves_old_target_intact(files, tmp_path):
    source = tmp_path / "big.zarr"
    synthetic_seismic((160, 160, 160), chunks=80).to_zarr(source)
    target = tmp_path / "dip.zarr"
    old = xr.Dataset({"dip": ("x", np.arange(5.0))})
    old.to_zarr(target)
    proc = subprocess.Popen(
        [
            *MEMCHUNK,
            "run",
            "gst3d",
            str(source),
            str(target),
            "--overwrite",
            "--nworkers",
            "1",
            "--memory-limit",
            "2GB",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and not any("memchunk-" in p.name for p in tmp_path.iterdir()):
        time.sleep(0.05)
    assert any("memchunk-" in p.name for p in tmp_path.iterdir()), "the write never started"
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)  # the client, its LocalCluster and workers: all at once
    proc.wait(timeout=30)
    intact = xr.open_zarr(target)
    np.testing.assert_array_equal(intact.dip.values, np.arange(5.0))
    leftovers = [p for p in tmp_path.iterdir() if p.name not in {"big.zarr", "dip.zarr"}]
    # whatever a hard kill leaves is hidden and never named like the target
    assert all(p.name.startswith(".dip.zarr.memchunk-partial-") for p in leftovers)


def test_cli_help_reads_well():
    result = memchunk("run", "--help")
    assert result.returncode == 0
    for flag in ("--nworkers", "--nthreads", "--memory-limit", "--scheduler", "--overwrite"):
        assert flag in result.stdout
    assert "1.5GB" in memchunk("plan", "--help").stdout
