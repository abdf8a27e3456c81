"""Daily fields with dates, as the tests of time operators (rolling, resample, groupby) use."""

import numpy as np
import pandas as pd
import xarray as xr


def daily(days=730, lat=20, lon=30, chunks=None, dtype="float32"):
    """Standard-normal ``tas`` of ``days`` x ``lat`` x ``lon`` from 2001-01-01, Dask-backed.

    ``chunks`` as ``.chunk()`` takes them; one day per chunk by default.
    """
    time = pd.date_range("2001-01-01", periods=days, freq="D")
    values = np.random.default_rng(0).standard_normal((days, lat, lon)).astype(dtype)
    array = xr.DataArray(
        values,
        dims=("time", "lat", "lon"),
        coords={"time": time, "lat": np.linspace(-80, 80, lat)},
        name="tas",
    )
    return array.chunk(chunks or {"time": 1})
