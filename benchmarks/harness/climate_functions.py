"""xarray expressions that Pangeo users run, as memchunk operators (issue 30's matrix).

Importing this module registers them: ``clim-month``, ``clim-doy``, ``anomaly``, ``monthly``,
``rolling-30``, ``area-mean``, ``trend`` and ``anomaly-p90`` (a two-step chain). Each takes a
DataArray with a daily ``time`` coordinate (and ``lat`` for the area mean).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

import xarray_memchunk as xm

__all__ = ["FUNCTIONS"]


@xm.operator(name="clim-month", whole=["time"])
def clim_month(tas: xr.DataArray, **flox: str) -> xr.DataArray:
    """Monthly climatology (``flox``: flox's options, e.g. ``method="cohorts"``)."""
    return tas.groupby("time.month").mean(**flox)


@xm.operator(name="clim-doy", whole=["time"])
def clim_doy(tas: xr.DataArray, **flox: str) -> xr.DataArray:
    """Day-of-year climatology (``flox``: as for :func:`clim_month`)."""
    return tas.groupby("time.dayofyear").mean(**flox)


@xm.operator(name="anomaly", whole=["time"])
def anomaly(tas: xr.DataArray, **flox: str) -> xr.DataArray:
    """Anomalies from the monthly climatology (``flox``: as for :func:`clim_month`)."""
    return tas.groupby("time.month") - tas.groupby("time.month").mean(**flox)


@xm.operator(name="monthly", whole=["time"])
def monthly(tas: xr.DataArray) -> xr.DataArray:
    """Monthly means."""
    return tas.resample(time="1MS").mean()


@xm.operator(name="rolling-30", whole=["time"])
def rolling_30(tas: xr.DataArray) -> xr.DataArray:
    """A centred 30-day moving mean."""
    return tas.rolling(time=30, center=True).mean()


@xm.operator(name="area-mean", free=["time"])
def area_mean(tas: xr.DataArray) -> xr.DataArray:
    """The cos(lat)-weighted mean over lat and lon."""
    return tas.weighted(np.cos(np.deg2rad(tas.lat))).mean(("lat", "lon"))


@xm.operator(name="trend", whole=["time"])
def trend(tas: xr.DataArray) -> xr.Dataset:
    """A linear fit over time."""
    return tas.polyfit("time", 1)


@xm.operator(name="anomaly-p90", whole=["time"])
def anomaly_p90(tas: xr.DataArray) -> xr.DataArray:
    """A chain: anomalies, then their 90th percentile per month."""
    deviation = tas.groupby("time.month") - tas.groupby("time.month").mean()
    return deviation.groupby("time.month").quantile(0.9)


#: Operator name -> the function as xarray runs it.
FUNCTIONS = {
    op.name: op
    for op in (clim_month, clim_doy, anomaly, monthly, rolling_30, area_mean, trend, anomaly_p90)
}
