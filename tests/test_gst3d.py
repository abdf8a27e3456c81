import numpy as np
import pytest
import xarray as xr
from harness.gst3d_reference import principal_eigen
from scipy import ndimage

import xarray_memchunk as xm
from xarray_memchunk.datasets import synthetic_seismic
from xarray_memchunk.operators.gst3d.kernels import gst3d_block, halo_depth


def d2geo_reference(x):
    """Straightforward unchunked d2geo / dasf-seismic GST, in float64, with np.linalg.eigh."""
    x = x.astype(np.float64)
    grads = []
    for axis in range(3):
        g = ndimage.correlate1d(x, [-0.5, 0.0, 0.5], axis=axis, mode="reflect")
        for other in range(3):
            if other != axis:
                g = ndimage.correlate1d(
                    g, [0.178947, 0.642105, 0.178947], axis=other, mode="reflect"
                )
        grads.append(g)
    tensor = np.empty((*x.shape, 3, 3))
    for i in range(3):
        for j in range(3):
            tensor[..., i, j] = ndimage.uniform_filter(grads[i] * grads[j], 3, mode="reflect")
    values, vectors = np.linalg.eigh(tensor)
    v = vectors[..., :, -1]
    v = v * np.where(v[..., 2] < 0, -1.0, 1.0)[..., None]
    dip = np.degrees(np.arccos(np.clip(v[..., 2], -1, 1)))
    azimuth = np.mod(np.degrees(np.arctan2(v[..., 0], v[..., 1])), 360.0)
    gap = (values[..., 2] - values[..., 1]) / np.maximum(values[..., 2], 1e-300)
    return dip, azimuth, gap


def test_closed_form_eigen_matches_eigh():
    rng = np.random.default_rng(3)
    m = rng.standard_normal((20_000, 3, 3))
    a = m @ m.transpose(0, 2, 1)  # symmetric positive semi-definite
    comps = [a[:, 0, 0], a[:, 1, 1], a[:, 2, 2], a[:, 0, 1], a[:, 0, 2], a[:, 1, 2]]
    values = np.empty((20_000, 3))
    vector = np.empty((20_000, 3))

    def take_values(s, l1, l2, l3):
        values[s] = np.stack([l1, l2, l3], axis=1)

    def take_vector(s, x, y, z):
        vector[s] = np.stack([x, y, z], axis=1)

    principal_eigen(comps, out_vector=take_vector, out_values=take_values, slab=4096)
    w, v = np.linalg.eigh(a)
    np.testing.assert_allclose(values, w[:, ::-1], rtol=1e-9, atol=1e-9 * np.abs(w).max())
    gap = (w[:, 2] - w[:, 1]) / w[:, 2]
    ok = gap > 1e-6
    alignment = np.abs(np.sum(vector * v[:, :, 2], axis=1))
    assert np.all(alignment[ok] > 1 - 1e-8)
    assert np.allclose(np.linalg.norm(vector, axis=1), 1.0)


def test_degenerate_tensor_gives_vertical():
    zeros = [np.zeros(4)] * 6
    out = {}
    principal_eigen(zeros, out_vector=lambda s, x, y, z: out.update(z=z))
    assert np.all(out["z"] == 1.0)


def test_d2geo_kernel_matches_reference_float64():
    x = synthetic_seismic(
        (40, 36, 32), dip_degrees=25, azimuth_degrees=60, noise=0.3, dtype="float64"
    ).amplitude.values
    dip, azimuth, gap = d2geo_reference(x)
    ours_dip = gst3d_block(x, kernel="d2geo", out_dtype="float64")
    ours_az = gst3d_block(x, kernel="d2geo", attribute="azimuth", out_dtype="float64")
    clear = gap > 1e-3  # the principal direction is defined
    assert clear.mean() > 0.95
    assert np.abs(ours_dip - dip)[clear].max() < 1e-6
    steep = clear & (dip > 5)  # azimuth of a flat reflector is undefined
    diff = np.abs((ours_az - azimuth + 180) % 360 - 180)
    assert diff[steep].max() < 1e-5


def test_d2geo_kernel_float32_close_to_reference():
    # float32 products carry ~1e-7 relative error; an eigenvector moves by ~eps / gap
    x = synthetic_seismic((40, 36, 32), dip_degrees=25, noise=0.3).amplitude.values
    dip, _, gap = d2geo_reference(x)
    ours = gst3d_block(x, kernel="d2geo")
    clear = gap > 1e-2
    assert np.median(np.abs(ours - dip)[clear]) < 1e-3
    assert np.abs(ours - dip)[clear].max() < 0.05


@pytest.mark.parametrize("kernel", ["gaussian", "d2geo"])
@pytest.mark.parametrize(
    "chunks",
    [
        {"inline": 30, "crossline": 41, "sample": 33},
        {"inline": 60, "crossline": 82, "sample": 17},
        {"inline": 19, "crossline": 20, "sample": 66},
    ],
)
def test_chunked_equals_unchunked(kernel, chunks, threaded):
    ds = synthetic_seismic((60, 82, 66), dip_degrees=30, noise=0.2)
    whole = ds.memchunk.apply("gst3d", kernel=kernel).dip.values
    chunked = ds.chunk(12).memchunk.apply("gst3d", kernel=kernel, chunks=chunks)
    assert chunked.dip.data.npartitions > 1
    # same arithmetic on the same values in the same order: bit-identical
    np.testing.assert_array_equal(chunked.dip.values, whole)


def test_planned_chunks_equal_unchunked(threaded):
    ds = synthetic_seismic((64, 64, 64), noise=0.2, chunks=16)
    budget = xm.Budget(
        worker_memory=10**9, threads_per_worker=1, n_workers=2, per_task=130 * 2**20, source="test"
    )  # 128 MiB of it is Numba's runtime, which a worker keeps once it has run GST3D
    plan = ds.memchunk.plan("gst3d", budget=budget)
    assert plan.n_chunks > 2
    result = ds.memchunk.apply("gst3d", budget=budget).dip.values
    np.testing.assert_array_equal(result, ds.load().memchunk.apply("gst3d").dip.values)


@pytest.mark.parametrize(("dip", "azimuth"), [(10.0, 0.0), (25.0, 45.0), (40.0, 200.0)])
def test_recovers_known_dip_and_azimuth(dip, azimuth, threaded):
    ds = synthetic_seismic(
        (64, 64, 64), dip_degrees=dip, azimuth_degrees=azimuth, noise=0.2, chunks=32
    )
    got = ds.memchunk.apply("gst3d", memory_limit="1GB").dip.values
    assert np.median(np.abs(got - dip)) < 1.0
    az = ds.memchunk.apply("gst3d", attribute="azimuth", memory_limit="1GB").azimuth.values
    assert np.median(np.abs((az - azimuth + 180) % 360 - 180)) < 2.0


def test_planarity_high_on_planes(threaded):
    ds = synthetic_seismic((40, 40, 40), noise=0.05)
    p = ds.memchunk.apply("gst3d", attribute="planarity").planarity.values
    lin = ds.memchunk.apply("gst3d", attribute="linearity").linearity.values
    assert np.median(p) > 0.8 and np.median(lin) < 0.2
    assert 0 <= p.min() and p.max() <= 1 + 1e-6


def test_float64_input_and_output_dtype(threaded):
    ds = synthetic_seismic((30, 30, 30), dtype="float64", chunks=15)
    assert ds.memchunk.apply("gst3d").dip.dtype == np.float32
    assert ds.memchunk.apply("gst3d", dtype="float64").dip.dtype == np.float64
    chunks = {"inline": 100, "crossline": 100, "sample": 100}
    p32 = synthetic_seismic((200, 200, 200), chunks=50).memchunk.plan("gst3d", chunks=chunks)
    p64 = synthetic_seismic((200, 200, 200), chunks=50, dtype="float64").memchunk.plan(
        "gst3d", chunks=chunks
    )
    assert p64.predicted_task_bytes > 1.5 * p32.predicted_task_bytes


def test_stack_of_volumes_is_a_free_dim(threaded):
    one = synthetic_seismic((30, 30, 30), dip_degrees=15).amplitude
    stack = xr.concat([one, -one], dim="survey").chunk({"survey": 1})
    plan = stack.memchunk.plan("gst3d", memory_limit="1GB")
    assert "survey" not in plan.halo
    out = stack.memchunk.apply("gst3d")
    assert out.dims == stack.dims
    np.testing.assert_array_equal(out.isel(survey=0).values, one.memchunk.apply("gst3d").values)


def test_dims_by_argument_and_by_cf_axes(threaded):
    ds = synthetic_seismic((30, 30, 30))
    renamed = ds.rename({"inline": "a", "crossline": "b", "sample": "c"})
    by_cf = renamed.memchunk.plan("gst3d")  # found through the axis attributes X, Y, Z
    assert set(by_cf.halo) == {"a", "b", "c"}
    bare = xr.DataArray(ds.amplitude.values, dims=("p", "q", "r"))
    with pytest.raises(xm.DimensionError, match="dims=\\(inline, crossline, sample\\)"):
        bare.memchunk.plan("gst3d")
    assert set(bare.memchunk.plan("gst3d", dims=("p", "q", "r")).halo) == {"p", "q", "r"}


def test_halo_depth_follows_parameters():
    assert halo_depth("gaussian", 1.0, 2.0, 3.0) == 3 + 6
    assert halo_depth("gaussian", 2.0, 4.0, 4.0) == 8 + 16
    assert halo_depth("d2geo", 1.0, 2.0, 3.0) == 2
    plan = synthetic_seismic((80, 80, 80), chunks=20).memchunk.plan(
        "gst3d", sigma=2.0, rho=4.0, truncate=4.0, memory_limit="1GB"
    )
    assert set(plan.halo.values()) == {24}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"attribute": "curvature"}, "attribute must be one of"),
        ({"kernel": "sobel"}, "kernel must be one of"),
        ({"sigma": -1}, "sigma must be a positive"),
        ({"dtype": "int16"}, "float dtype"),
        ({"window": 3}, "unexpected arguments"),
    ],
)
def test_bad_arguments_fail_before_compute(kwargs, match):
    ds = synthetic_seismic((20, 20, 20), chunks=10)
    with pytest.raises(xm.MemchunkError, match=match):
        ds.memchunk.apply("gst3d", **kwargs)
