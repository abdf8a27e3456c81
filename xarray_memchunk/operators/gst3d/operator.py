"""GST3D: seismic dip (and azimuth, planarity, linearity) from the gradient structure tensor.

Runs as one task per chunk: ``dask.array.map_overlap`` over the three spatial dims with the halo
depth the kernels need (:func:`~xarray_memchunk.operators.gst3d.kernels.halo_depth`) and
``boundary="none"`` (blocks at the volume's edge use the kernels' own ``reflect`` mode), or,
for a volume read straight from a file, each task reading its padded block from the file
(:func:`~xarray_memchunk.operators.sources.map_blocks_with_halo`). A chunked result equals the
unchunked computation voxel for voxel.

Defaults (``kernel="gaussian"``): ``sigma=1.0`` voxel for the derivative-of-Gaussian gradients
(the scale of the reflectors), ``rho=2.0`` voxels for the tensor smoothing (the integration
window over which one orientation is estimated), truncated at ``truncate=3.0`` standard
deviations: a halo of 3 + 6 = 9 voxels per side.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from ...errors import DimensionError, MemchunkError
from ...models import LinearMemoryModel
from ...planning.problem import DimRole
from ..arguments import check_number, float_dtype, reject_unknown
from ..base import Cost, DimUse, Features, Operator, padded_elements
from ..dims import resolve_dim
from ..sources import device_of, map_blocks_with_halo
from .kernels import ATTRIBUTES, KERNELS, gst3d_on_axes, halo_depth
from .workspace import batch_size, correlation_weights, workspace_planes

__all__ = ["GST3D", "SPATIAL_NAMES", "fused_features", "spatial_dims"]

#: Names recognised for (inline, crossline, sample), in order of preference.
SPATIAL_NAMES = (
    ("inline", "iline", "il"),
    ("crossline", "xline", "xl"),
    ("sample", "samples", "depth", "time", "twt", "z"),
)
_CF_AXES = (("X",), ("Y",), ("Z", "T"))

#: What a worker keeps after its first fused GST3D task: Numba imported, LLVM started and the
#: compiled kernel loaded from Numba's cache (122 MB measured in a ``LocalCluster`` worker:
#: 162 MB RSS with dask, xarray, zarr and this package imported, 284 MB after a first block).
FUSED_RUNTIME_BYTES = 128 * 2**20

_UNITS = {"dip": "degree", "azimuth": "degree", "planarity": "1", "linearity": "1"}
_LONG_NAMES = {
    "dip": "dip angle of reflectors from horizontal (GST3D)",
    "azimuth": "dip azimuth, atan2(inline, crossline) (GST3D)",
    "planarity": "planarity (l1 - l2) / l1 of the gradient structure tensor",
    "linearity": "linearity (l2 - l3) / l1 of the gradient structure tensor",
}


def spatial_dims(da: xr.DataArray, dims: Sequence[str] | None = None) -> tuple[str, str, str]:
    """Find the (inline, crossline, sample) dims of ``da``.

    By ``dims`` when given (names or CF axes), else by the names in :data:`SPATIAL_NAMES`, else
    by CF axes X, Y, Z (or T for time-domain data).

    Raises
    ------
    DimensionError
        When any of the three cannot be found.
    """
    if dims is not None:
        if len(dims) != 3:
            raise DimensionError(
                f"gst3d needs three dims (inline, crossline, sample), got {dims!r}"
            )
        found = tuple(resolve_dim(da, d) for d in dims)
    else:
        found_list = []
        for names, axes in zip(SPATIAL_NAMES, _CF_AXES, strict=True):
            match = next((n for n in names if n in da.dims), None)
            for axis in axes if match is None else ():
                try:
                    match = resolve_dim(da, axis)
                    break
                except DimensionError:
                    continue
            if match is None:
                raise DimensionError(
                    f"gst3d cannot find the {names[0]} dim among dims {tuple(da.dims)}: name it "
                    f"one of {names}, give CF axis attributes, or pass dims=(inline, crossline, "
                    f"sample)"
                )
            found_list.append(match)
        found = tuple(found_list)
    if len(set(found)) != 3:
        raise DimensionError(f"gst3d needs three different dims, got {found}")
    return found  # type: ignore[return-value]


def _check_radius(label: str, scale: float, truncate: float, dim: str, length: int) -> None:
    """Refuse a Gaussian kernel whose radius is longer than the volume's longest dim.

    Such a halo cannot be what was meant, and it would be planned and run at any cost
    (``truncate=1e6`` on a 24 x 20 x 18 volume: a halo of 3 million voxels per side, planned
    as one 2.6 MB task).

    Raises
    ------
    MemchunkError
        Stating the radius, the dim's length and a value of ``truncate`` or ``label`` that fits.
    """
    radius = truncate * scale + 0.5  # scipy's radius is int() of this; inf where it overflows
    if radius < length + 1:
        return
    shown = f"a radius of {int(radius):,} voxels" if math.isfinite(radius) else "an infinite radius"
    if length / scale >= 1:  # truncating at one standard deviation or more still fits
        suggestion = f"truncate <= {_round_down(length / scale)} (the default is 3)"
    else:
        suggestion = f"{label} <= {_round_down(length / 3)} with the default truncate=3"
    raise MemchunkError(
        f"gst3d's Gaussian kernel for {label}={scale:g}, truncated at truncate={truncate:g}, "
        f"has {shown}, longer than the volume's longest dim {dim!r} "
        f"({length} voxels): a halo longer than the volume cannot be what was meant; use "
        f"{suggestion}"
    )


def _round_down(value: float) -> str:
    """``value`` rounded down to 3 significant digits, for a suggested upper bound."""
    digits = 2 - math.floor(math.log10(value))
    return f"{math.floor(value * 10**digits) / 10**digits:g}"


def _arguments(
    attribute: str = "dip",
    kernel: str = "gaussian",
    sigma: float = 1.0,
    rho: float = 2.0,
    truncate: float = 3.0,
    dims: Sequence[str] | None = None,
    dtype: str | np.dtype = "float32",
    **unknown: Any,
) -> dict[str, Any]:
    """GST3D's arguments checked, with their defaults.

    Raises
    ------
    MemchunkError
        Naming the unknown or invalid argument.
    """
    reject_unknown(GST3D.name, unknown, _arguments)
    if attribute not in ATTRIBUTES:
        raise MemchunkError(f"gst3d attribute must be one of {ATTRIBUTES}, got {attribute!r}")
    if kernel not in KERNELS:
        raise MemchunkError(f"gst3d kernel must be one of {KERNELS}, got {kernel!r}")
    for label, value in (("sigma", sigma), ("rho", rho), ("truncate", truncate)):
        if check_number(GST3D.name, label, value, minimum=None) <= 0:
            raise MemchunkError(f"gst3d {label} must be a positive number, got {value!r}")
    float_dtype(dtype, "gst3d output dtype")
    if dims is not None and (isinstance(dims, str) or len(dims) != 3):
        raise MemchunkError(
            f"gst3d dims must name three dims (inline, crossline, sample), got {dims!r}"
        )
    return {
        "attribute": attribute,
        "kernel": kernel,
        "sigma": float(sigma),
        "rho": float(rho),
        "truncate": float(truncate),
        "dims": tuple(dims) if dims is not None else None,
        "dtype": np.dtype(dtype).name,
    }


class GST3D(Operator):
    """Gradient structure tensor attributes of 3-D seismic amplitudes.

    Keyword Arguments:
    -----------------
    attribute : {"dip", "azimuth", "planarity", "linearity"}
        What to return (default ``"dip"``, degrees, 0 = flat).
    kernel : {"gaussian", "d2geo"}
        ``"gaussian"`` (default) or the d2geo / dasf-seismic 3-point kernel.
    sigma, rho, truncate : float
        Gaussian kernel parameters (``kernel="gaussian"`` only): 1.0, 2.0, 3.0.
    dims : sequence of 3 str, optional
        The (inline, crossline, sample) dims, when they are not found by name or CF axis.
    dtype : str, optional
        Output dtype, float32 by default.
    """

    name = "gst3d"
    description = "GST3D seismic dip/azimuth/planarity/linearity (one map_overlap, halo-aware)"
    #: Amplitudes: integers (counts) and float16, converted to float32 block by block, or
    #: float32 and float64 (float128 is refused by :meth:`check_arguments`).
    dtype_kinds = "iuf"
    #: NumPy blocks run the fused Numba kernel; CuPy blocks the same passes as CUDA kernels.
    devices = ("cpu", "gpu")
    #: The Gaussian kernel and the 3-point one are calibrated apart (``gst3d-d2geo``).
    shipped_calibrations = ({}, {"kernel": "d2geo"})

    def check_arguments(
        self, kwargs: Mapping[str, Any], da: xr.DataArray | None = None
    ) -> dict[str, Any]:
        """Check the arguments before anything runs; then the data's dtype and the kernels' radii.

        Raises
        ------
        MemchunkError
            Unknown or invalid arguments. For ``da``: float128 data (the kernels compute in
            float32 or float64), or a kernel whose radius is longer than the volume's longest
            spatial dim.
        DimensionError
            For ``da``: when the spatial dims cannot be found.
        """
        if da is None:
            return _arguments(**kwargs)
        if da.dtype.kind == "f" and da.dtype.itemsize > 8:
            raise MemchunkError(
                f"gst3d computes in float32 or float64 and its kernels take no {da.dtype}: "
                f"convert the data first, e.g. .astype('float64')"
            )
        if kwargs["kernel"] == "gaussian" and da.dtype.kind in self.dtype_kinds:
            # (other dtypes are refused, naming the dtype, when their cost is resolved)
            spatial = spatial_dims(da, kwargs["dims"])
            longest = max(spatial, key=lambda d: da.sizes[d])
            for label in ("sigma", "rho"):
                _check_radius(label, kwargs[label], kwargs["truncate"], longest, da.sizes[longest])
        return dict(kwargs)

    def dims(self, da: xr.DataArray, dims=None, **kwargs: Any) -> dict[str, DimUse]:
        """The three spatial dims are halo dims; any other dim (a stack of volumes) is free."""
        depth = halo_depth(kwargs["kernel"], kwargs["sigma"], kwargs["rho"], kwargs["truncate"])
        return {d: DimUse(DimRole.HALO, depth) for d in spatial_dims(da, dims)}

    def cost(self, da: xr.DataArray, **kwargs: Any) -> Cost:
        """One fused task per chunk: its padded input, its output and the kernel's workspace.

        Calibrated as ``gst3d`` and ``gst3d-d2geo`` (the 3-point kernel) apart. Features
        (:func:`fused_features`): the padded input (twice where the block is copied to the
        compute dtype or to (inline, crossline, sample) order first), the output, and the
        fused kernel's workspace (:func:`~.fused.workspace_planes`: planes of crossline x
        sample, whatever the block's inline length). Analytic model until calibrated: those,
        1 byte each, 8 MiB fixed; and once per worker, Numba's runtime
        (:data:`FUSED_RUNTIME_BYTES`). CuPy blocks run the CUDA passes (:mod:`.gpu_filters`):
        at most 9 padded blocks in the compute dtype (the input, the gradients still needed, a
        scratch buffer and the tensor components), the output, 8 MiB fixed.
        """
        on_cpu = device_of(da) == "cpu"
        if on_cpu:
            weights = {"input_bytes": 1.0, "output_bytes": 1.0, "workspace_bytes": 1.0}
        else:
            compute_itemsize = 8 if np.dtype(da.dtype) == np.float64 else 4
            weights = {"input_bytes": 9 * compute_itemsize / da.dtype.itemsize}
            weights["output_bytes"] = 1.0
        model = LinearMemoryModel(weights, intercept=8 * 2**20)
        return Cost(
            "gst3d" if kwargs["kernel"] == "gaussian" else "gst3d-d2geo",
            fused_features(da, kwargs),
            model,
            seconds_per_element=6e-8,
            runtime_bytes=FUSED_RUNTIME_BYTES if on_cpu else 0.0,
        )

    def runtime_loaded(self) -> bool:
        """Whether this process has loaded the fused kernel (:data:`FUSED_RUNTIME_BYTES`)."""
        from .fused import kernel_loaded

        return kernel_loaded()

    def calibration_setup(self, **kwargs: Any) -> tuple[dict[str, Any], list[dict[str, int]]]:
        """The arguments as given; padded blocks of 32^3 to 8.2 million voxels, cubes and slabs.

        Thin inline slabs too (19 and 24 planes: a chunk of 1 to 6 inlines and its halo), where
        the kernel's workspace of whole planes outweighs the block.
        """
        sizes = [
            (19, 200, 200),
            (24, 256, 128),
            (32, 32, 32),
            (64, 48, 40),
            (64, 64, 64),
            (100, 80, 60),
            (40, 160, 160),
            (100, 100, 100),
            (128, 128, 96),
            (160, 120, 140),
            (200, 200, 200),
            (256, 160, 200),
        ]
        shapes = [{"inline": a, "crossline": b, "sample": c} for a, b, c in sizes]
        return self.check_arguments(kwargs), shapes

    def compute(self, da: xr.DataArray, uses: Mapping[str, DimUse], **kwargs: Any) -> xr.DataArray:
        """Run GST3D lazily, one task per chunk with its halo (or directly on numpy data).

        For NumPy data the fused kernel is compiled (or loaded from Numba's cache) here first,
        in this process (:func:`~.fused.warm`): workers on this machine then load it.
        """
        if device_of(da) == "cpu" and da.dtype.kind in self.dtype_kinds:
            from .fused import warm

            warm(np.float64 if da.dtype == np.float64 else np.float32, kwargs["dtype"])
        spatial = spatial_dims(da, kwargs.get("dims"))
        axes = tuple(da.get_axis_num(d) for d in spatial)
        block_kwargs = {
            k: kwargs[k] for k in ("attribute", "kernel", "sigma", "rho", "truncate")
        } | {"out_dtype": kwargs["dtype"], "axes": axes}
        depth = {axis: uses[d].depth for axis, d in zip(axes, spatial, strict=True)}
        result = map_blocks_with_halo(
            da.data, gst3d_on_axes, depth, kwargs["dtype"], **block_kwargs
        )
        attribute = kwargs["attribute"]
        return xr.DataArray(
            result,
            dims=da.dims,
            coords=da.coords,
            name=attribute,
            attrs={"units": _UNITS[attribute], "long_name": _LONG_NAMES[attribute]},
        )

    def compute_dataset(self, ds, uses, **kwargs):
        """One output variable per input variable: ``{name}_{attribute}`` when several."""
        if len(uses) == 1:
            (name,) = uses
            return self.compute(ds[name], uses[name], **kwargs).to_dataset()
        return xr.Dataset(
            {f"{n}_{kwargs['attribute']}": self.compute(ds[n], uses[n], **kwargs) for n in uses},
            attrs=ds.attrs,
        )


def fused_features(da: xr.DataArray, kwargs: Mapping[str, Any]) -> Features:
    """The memory features of one fused GST3D task on ``da`` (:mod:`.fused`).

    ``input_bytes``: the padded block, plus its copy where the kernel needs one (a dtype other
    than float32 or float64, or spatial dims not last and in (inline, crossline, sample)
    order). ``output_bytes``: the result. ``workspace_bytes``: the kernel's planes of
    crossline x sample (:func:`~.fused.workspace_planes` for the block's inline length and the
    batch it affords, :func:`~.fused.batch_size`), in the compute dtype.
    """
    inline, crossline, sample = spatial_dims(da, kwargs.get("dims"))
    dtype = np.dtype(da.dtype)
    compute_itemsize = 8 if dtype == np.float64 else 4
    copied = dtype not in (np.float32, np.float64) or tuple(da.dims[-3:]) != (
        inline,
        crossline,
        sample,
    )
    input_itemsize = dtype.itemsize + (compute_itemsize if copied else 0)
    output_itemsize = np.dtype(kwargs.get("dtype", "float32")).itemsize
    kernel = kwargs["kernel"]
    taps = correlation_weights(kernel, kwargs["sigma"], kwargs["rho"], kwargs["truncate"])[2].size

    def features(padded: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        elements = padded_elements(padded)
        planes = np.vectorize(
            lambda n0: workspace_planes(int(n0), kernel, taps, batch_size(int(n0), kernel, taps)),
            otypes=[np.float64],
        )(np.asarray(padded[inline]))
        plane = np.asarray(padded[crossline], np.float64) * np.asarray(padded[sample], np.float64)
        return {
            "input_bytes": elements * input_itemsize,
            "output_bytes": elements * output_itemsize,
            "workspace_bytes": planes * plane * compute_itemsize,
        }

    return features
