"""GST3D's structure tensor with ``cupyx.scipy.ndimage``: the GPU path before its CUDA passes.

Kept as the baseline ``benchmarks/gpu_gst3d_stages.py`` times the library's passes
(:mod:`xarray_memchunk.operators.gst3d.gpu_filters`) against: each gradient a
``gaussian_filter`` (three passes), each product smoothed by another, intermediates freed
as soon as they are used. Gaussian kernel only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["cupyx_structure_tensor"]


def cupyx_structure_tensor(
    x: Any, sigma: float = 1.0, rho: float = 2.0, truncate: float = 3.0
) -> list[Any]:
    """The six smoothed components (xx, yy, zz, xy, xz, yz), flat, in ``x``'s dtype."""
    import cupy
    from cupyx.scipy import ndimage

    def gradient(axis: int) -> Any:
        order = [0, 0, 0]
        order[axis] = 1
        return ndimage.gaussian_filter(
            x, sigma, order=order, output=x.dtype, mode="reflect", truncate=truncate
        )

    gradients = {"x": gradient(0), "y": gradient(1), "z": gradient(2)}
    buf = cupy.empty_like(x)
    tensor = {}
    for key in ("xx", "xy", "xz", "yy", "yz", "zz"):
        cupy.multiply(gradients[key[0]], gradients[key[1]], out=buf)
        tensor[key] = cupy.empty_like(buf)
        ndimage.gaussian_filter(buf, rho, output=tensor[key], mode="reflect", truncate=truncate)
        if key in ("xz", "yz", "zz"):
            del gradients[key[0]]
    return [tensor[k].reshape(-1) for k in ("xx", "yy", "zz", "xy", "xz", "yz")]
