"""Generated datasets for demos, tests and notebooks: nothing is downloaded."""

from __future__ import annotations

from collections.abc import Mapping

import dask.array as da
import numpy as np
import xarray as xr

__all__ = ["synthetic_climate", "synthetic_seismic"]


def _hash_noise(i, j, k, seed: int) -> np.ndarray:
    """Deterministic noise in [-1, 1] from global indices: the same whatever the chunking."""
    h = np.sin(i * 12.9898 + j * 78.233 + k * 37.719 + seed * 4.1414) * 43758.5453
    return 2.0 * (h - np.floor(h)) - 1.0


def _generate(shape, chunks, dtype, name, values):
    """``values(block_shape, offsets)`` for the whole array (numpy), or per chunk (lazy).

    Each chunk is computed from its global offsets where it is needed, so a lazily generated
    array holds nothing in the graph and is the same for any chunking.
    """
    if chunks is None:
        return values(tuple(shape), (0,) * len(shape))
    template = da.empty(shape, chunks=chunks, dtype=dtype)

    def block(x, block_info=None):
        offsets = [lo for lo, _ in block_info[None]["array-location"]]
        return values(x.shape, offsets)

    return template.map_blocks(block, dtype=dtype, token=name)


def _seismic_block(shape, offsets, normal, waves, noise, seed, dtype):
    """One block, computed an inline slice at a time so float64 temporaries stay small."""
    out = np.empty(shape, dtype=dtype)
    j, k = np.ogrid[offsets[1] : offsets[1] + shape[1], offsets[2] : offsets[2] + shape[2]]
    for local in range(shape[0]):
        i = offsets[0] + local
        u = normal[0] * i + normal[1] * j + normal[2] * k  # distance across the reflectors
        amplitude = np.zeros(shape[1:], dtype=np.float64)
        for wavelength, phase, weight in waves:
            amplitude += weight * np.cos(2.0 * np.pi * u / wavelength + phase)
        if noise:
            amplitude += noise * _hash_noise(i, j, k, seed)
        out[local] = amplitude
    return out


def synthetic_seismic(
    shape: tuple[int, int, int] = (200, 200, 200),
    *,
    dip_degrees: float = 20.0,
    azimuth_degrees: float = 30.0,
    noise: float = 0.1,
    seed: int = 0,
    chunks: str | int | tuple | Mapping | None = None,
    dtype: str = "float32",
) -> xr.Dataset:
    """A volume of plane, dipping reflectors with a known dip and azimuth, plus noise.

    Amplitudes are a sum of three cosines of the distance across the reflector planes
    (wavelengths 6-14 samples, random phases and weights from ``seed``) plus uniform noise of
    amplitude ``noise`` (a hash of the global voxel index: the same for any chunking). The
    normal of the planes is ``(sin(dip) sin(az), sin(dip) cos(az), cos(dip))`` in
    (inline, crossline, sample), so GST3D should return ``dip_degrees`` everywhere.

    Parameters
    ----------
    shape
        (inline, crossline, sample) sizes.
    dip_degrees, azimuth_degrees
        Orientation of the reflectors.
    noise
        Noise amplitude relative to a signal of amplitude ~1.
    seed
        Seeds the wavelet phases and weights, and the noise.
    chunks
        None for a numpy-backed volume; anything ``dask.array`` takes (e.g. ``"auto"``) for a
        lazily generated one (each chunk is generated on the worker that needs it).
    dtype
        Amplitude dtype.

    Returns
    -------
    xarray.Dataset
        ``amplitude(inline, crossline, sample)`` with CF-style coordinates, and the true
        ``dip_degrees`` / ``azimuth_degrees`` in ``attrs``.
    """
    rng = np.random.default_rng(seed)
    waves = [
        (float(w), float(rng.uniform(0, 2 * np.pi)), float(rng.uniform(0.5, 1.0)))
        for w in (6.0, 9.0, 14.0)
    ]
    dip, az = np.radians(dip_degrees), np.radians(azimuth_degrees)
    normal = (np.sin(dip) * np.sin(az), np.sin(dip) * np.cos(az), np.cos(dip))
    data = _generate(
        tuple(shape),
        chunks,
        dtype,
        "synthetic-seismic",
        lambda block_shape, offsets: _seismic_block(
            block_shape, offsets, normal, waves, noise, seed, dtype
        ),
    )
    coords = {
        "inline": ("inline", np.arange(shape[0]), {"axis": "X", "long_name": "inline number"}),
        "crossline": (
            "crossline",
            np.arange(shape[1]),
            {"axis": "Y", "long_name": "crossline number"},
        ),
        "sample": (
            "sample",
            np.arange(shape[2]) * 4.0,
            {"axis": "Z", "units": "ms", "positive": "down", "long_name": "two-way time"},
        ),
    }
    amplitude = xr.DataArray(
        data,
        dims=("inline", "crossline", "sample"),
        coords=coords,
        name="amplitude",
        attrs={"long_name": "seismic amplitude"},
    )
    return amplitude.to_dataset().assign_attrs(
        dip_degrees=float(dip_degrees),
        azimuth_degrees=float(azimuth_degrees),
        title="xarray-memchunk synthetic seismic volume",
    )


def synthetic_climate(
    n_time: int = 365,
    n_lat: int = 90,
    n_lon: int = 180,
    *,
    seed: int = 0,
    chunks: str | int | tuple | Mapping | None = None,
    dtype: str = "float32",
) -> xr.Dataset:
    """A daily near-surface temperature field with CF attributes (``time`` is CF axis T).

    Temperature is a latitude profile plus a seasonal cycle plus hashed noise (deterministic,
    chunking-independent), in kelvin.

    Parameters
    ----------
    n_time, n_lat, n_lon
        Sizes of ``time``, ``lat`` and ``lon``.
    seed
        Seeds the noise.
    chunks
        None for numpy; anything ``dask.array`` takes for a lazily generated field, e.g.
        ``{"time": 1}`` per-day chunks like one-file-per-day model output.
    dtype
        dtype of ``tas``.
    """
    lat = np.linspace(-89.0, 89.0, n_lat)
    lon = np.linspace(0.0, 360.0, n_lon, endpoint=False)
    shape = (n_time, n_lat, n_lon)

    def block_values(shape_, offsets):
        t, y, x = np.ogrid[
            offsets[0] : offsets[0] + shape_[0],
            offsets[1] : offsets[1] + shape_[1],
            offsets[2] : offsets[2] + shape_[2],
        ]
        phi = np.radians(lat[y])
        season = np.cos(2 * np.pi * t / 365.25) * np.sin(phi)
        values = 250.0 + 40.0 * np.cos(phi) + 10.0 * season + 2.0 * _hash_noise(t, y, x, seed)
        return values.astype(dtype)

    if isinstance(chunks, Mapping):
        chunks = tuple(chunks.get(n, -1) for n in ("time", "lat", "lon"))
    data = _generate(shape, chunks, dtype, "synthetic-climate", block_values)
    time = np.arange(n_time)
    coords = {
        "time": (
            "time",
            time,
            {"axis": "T", "standard_name": "time", "units": "days since 2000-01-01"},
        ),
        "lat": ("lat", lat, {"axis": "Y", "standard_name": "latitude", "units": "degrees_north"}),
        "lon": ("lon", lon, {"axis": "X", "standard_name": "longitude", "units": "degrees_east"}),
    }
    tas = xr.DataArray(
        data,
        dims=("time", "lat", "lon"),
        coords=coords,
        name="tas",
        attrs={"standard_name": "air_temperature", "units": "K"},
    )
    return tas.to_dataset()
