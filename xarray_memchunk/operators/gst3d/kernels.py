"""GST3D on one block: gradients, structure tensor, principal direction, attributes.

Two kernels:

- ``"gaussian"``: gradients by Gaussian derivatives of scale ``sigma``, tensor products
  smoothed by a Gaussian of scale ``rho`` (both truncated at ``truncate`` standard deviations);
- ``"d2geo"``: what the d2geo and dasf-seismic attribute libraries compute: a 3-point central
  derivative ``[-0.5, 0, 0.5]`` with ``[0.178947, 0.642105, 0.178947]`` smoothing along the
  other two axes, products smoothed by a 3x3x3 box filter.

Both use ``reflect`` boundaries (``d c b a | a b c d``). Axes are (inline, crossline, sample),
the last three of the block.

NumPy blocks run :func:`.fused.gst3d`: one compiled (Numba) sweep along the block's first
axis computes the gradients, their products, the smoothing and each voxel's eigen-analysis
plane by plane, so besides the padded input and the output it holds only a ring of planes.
The peak (Gaussian kernel, input and float32 output included) is ~10 bytes per padded voxel
of float32 for a block of 256 planes, ~15 for 64, ~27 for 19, and ~36 at 13 planes, what the
unfused pipeline (three gradients, a product buffer and six tensor components) needs on any
block; blocks of fewer planes need more (:mod:`.fused`). A chain of ``map_overlap`` calls, a
``da.stack`` of nine components and ``np.linalg.eigh`` would need ~240 B/voxel. The filters
are SciPy's arithmetic operation for operation, in the input's precision (float32 for all but
float64), so the tensor is bit-identical to ``scipy.ndimage``'s; the eigen-analysis is
a closed form per voxel, in float64.

CuPy blocks run the same passes as CUDA kernels (:mod:`.gpu_filters`: the same arithmetic,
so the same tensor, bit for bit), freeing each intermediate as soon as it is used, so the peak
is at most nine padded blocks in the input's precision (the input, gradients still needed, a
scratch buffer and the tensor components; float32 in: ~36 bytes per padded voxel), and the
eigen-analysis as one fused CUDA kernel (:mod:`.gpu`): the block never leaves the device.

NaNs: every filter is a direct correlation that multiplies every tap, zero weights included
(the box filter too, instead of ``scipy.ndimage.uniform_filter``'s running sum, which carries
a NaN to the end of its line), so an output voxel is NaN exactly when an input voxel within
its halo (:func:`halo_depth`) is NaN, for every attribute, and a chunked result equals the
unchunked one, NaNs included, on either device.
"""

from __future__ import annotations

import numpy as np

from ..arrays import array_module, is_cupy

__all__ = ["ATTRIBUTES", "KERNELS", "gst3d_block", "gst3d_on_axes", "halo_depth"]

ATTRIBUTES = ("dip", "azimuth", "planarity", "linearity")
KERNELS = ("gaussian", "d2geo")


def _radius(scale: float, truncate: float) -> int:
    """Kernel radius scipy uses for a Gaussian of ``scale`` truncated at ``truncate``."""
    return int(truncate * float(scale) + 0.5)


def halo_depth(kernel: str, sigma: float, rho: float, truncate: float) -> int:
    """Halo (elements per side) a block needs so chunked results equal unchunked ones.

    The gradient reads ``r_sigma`` neighbours and the tensor smoothing ``r_rho`` more, so an
    output voxel depends on input voxels up to ``r_sigma + r_rho`` away.
    """
    if kernel == "d2geo":
        return 2
    return _radius(sigma, truncate) + _radius(rho, truncate)


def gst3d_block(
    block: np.ndarray,
    *,
    attribute: str = "dip",
    kernel: str = "gaussian",
    sigma: float = 1.0,
    rho: float = 2.0,
    truncate: float = 3.0,
    out_dtype: np.dtype | str = "float32",
) -> np.ndarray:
    """Compute a GST3D attribute on one block whose last three axes are (inline, crossline, sample).

    Parameters
    ----------
    block
        Amplitudes, float32 or float64 (others are filtered in float32); leading axes (a stack
        of volumes) are looped over. A NumPy block that is not C-contiguous is copied first.
    attribute
        ``"dip"`` (degrees from horizontal, 0..90), ``"azimuth"`` (degrees, 0..360,
        ``atan2(v_inline, v_crossline)``), ``"planarity"`` ((l1 - l2) / l1) or ``"linearity"``
        ((l2 - l3) / l1), from the principal eigenvector / eigenvalues l1 >= l2 >= l3.
    kernel
        ``"gaussian"`` or ``"d2geo"`` (see the module docstring).
    sigma, rho, truncate
        Gaussian kernel scales (voxels) and truncation (standard deviations).
    out_dtype
        dtype of the result.

    Returns
    -------
    numpy.ndarray or cupy.ndarray
        Same shape as ``block``, on ``block``'s device.
    """
    xp = array_module(block)
    options = {"attribute": attribute, "kernel": kernel, "sigma": sigma, "rho": rho}
    options |= {"truncate": truncate, "out_dtype": out_dtype}
    if block.ndim > 3:
        out = xp.empty(block.shape, dtype=out_dtype)
        for index in np.ndindex(block.shape[:-3]):
            out[index] = gst3d_block(block[index], **options)
        return out
    if not is_cupy(block):
        from .fused import gst3d as fused_gst3d  # Numba, imported where a task runs

        return fused_gst3d(np.asarray(block), **options)
    from .gpu import gpu_attribute
    from .gpu_filters import gpu_structure_tensor

    if block.size == 0:  # a CUDA grid may not be empty
        return xp.empty(block.shape, dtype=out_dtype)
    dtype = np.float64 if block.dtype == np.float64 else np.float32
    components = gpu_structure_tensor(block, kernel, sigma, rho, truncate, dtype)
    out = xp.empty(block.shape, dtype=out_dtype)
    gpu_attribute(components, attribute, out.reshape(-1))
    return out


def gst3d_on_axes(
    block: np.ndarray, *, axes: tuple[int, int, int] = (-3, -2, -1), **kwargs
) -> np.ndarray:
    """:func:`gst3d_block` on a block whose (inline, crossline, sample) are ``axes``.

    Integer and float16 amplitudes are converted to float32 here, block by block (SciPy's
    filters take neither). Other axes (a stack of volumes) are looped over. Keyword
    arguments are :func:`gst3d_block`'s.
    """
    last = (-3, -2, -1)
    xp = array_module(block)
    moved = xp.moveaxis(block, axes, last)
    if moved.dtype not in (np.float32, np.float64):
        moved = moved.astype(np.float32)
    return xp.moveaxis(gst3d_block(moved, **kwargs), last, axes)
