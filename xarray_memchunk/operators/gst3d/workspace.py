"""The fused GST3D kernel's weights and workspace, without Numba: what planning prices a task by.

Planning imports this module, not :mod:`.fused`: importing Numba costs a process ~53 MB
(measured after dask and xarray), which a worker should pay only when it runs a GST3D task.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "BATCHES",
    "D2GEO_BOX",
    "D2GEO_DERIVATIVE",
    "D2GEO_SMOOTHING",
    "batch_size",
    "correlation_weights",
    "gaussian_weights",
    "symmetry",
    "workspace_planes",
]

D2GEO_DERIVATIVE = np.array([-0.5, 0.0, 0.5])
D2GEO_SMOOTHING = np.array([0.178947, 0.642105, 0.178947])
D2GEO_BOX = np.full(3, 1.0 / 3.0)

#: Batches of output planes :func:`batch_size` chooses from, largest first.
BATCHES = (4, 2, 1)


def gaussian_weights(sigma: float, order: int, truncate: float) -> np.ndarray:
    """Weights :func:`scipy.ndimage.gaussian_filter1d` correlates with, by SciPy's formula.

    The kernel of ``scipy.ndimage._filters._gaussian_kernel1d`` (order 0 or 1), of radius
    ``int(truncate * sigma + 0.5)``, reversed as ``gaussian_filter1d`` reverses it.
    ``gaussian_filter`` skips an axis whose sigma is not above 1e-15: its weights are ``[1]``.
    """
    sigma = float(sigma)
    if not sigma > 1e-15:
        return np.ones(1)
    radius = int(truncate * sigma + 0.5)
    sigma2 = sigma * sigma
    x = np.arange(-radius, radius + 1)
    phi_x = np.exp(-0.5 / sigma2 * x**2)
    phi_x = phi_x / phi_x.sum()
    if order == 0:
        kernel = phi_x
    elif order == 1:
        # SciPy's polynomial recursion, one step: q(x) = -x / sigma^2
        exponent_range = np.arange(order + 1)
        q = np.zeros(order + 1)
        q[0] = 1
        q_deriv = np.diag(exponent_range[1:], 1) + np.diag(np.ones(order) / -sigma2, -1)
        q = q_deriv.dot(q)
        q = (x[:, None] ** exponent_range).dot(q)
        kernel = q * phi_x
    else:
        raise ValueError("order must be 0 or 1")
    return np.ascontiguousarray(kernel[::-1], dtype=np.float64)


def symmetry(weights: np.ndarray) -> int:
    """1, -1 or 0: SciPy's test for a symmetric, antisymmetric or general kernel."""
    size = weights.shape[0]
    if size % 2 == 0:
        return 0
    half = size // 2
    eps = np.finfo(np.float64).eps
    if all(abs(weights[half + i] - weights[half - i]) <= eps for i in range(1, half + 1)):
        return 1
    if all(abs(weights[half + i] + weights[half - i]) <= eps for i in range(1, half + 1)):
        return -1
    return 0


def correlation_weights(kernel: str, sigma: float, rho: float, truncate: float):
    """The derivative, smoothing and tensor-smoothing weights of ``kernel``, as SciPy uses them.

    Returns
    -------
    tuple
        ``(derivative, smoothing, tensor)``, each a float64 array of odd length in correlation
        order.
    """
    if kernel == "d2geo":
        return D2GEO_DERIVATIVE.copy(), D2GEO_SMOOTHING.copy(), D2GEO_BOX.copy()
    if kernel != "gaussian":
        raise ValueError(f"unknown kernel {kernel!r}")
    return (
        gaussian_weights(sigma, 1, truncate),
        gaussian_weights(sigma, 0, truncate),
        gaussian_weights(rho, 0, truncate),
    )


def workspace_planes(n0: int, kernel: str, tensor_taps: int, batch: int) -> int:
    """Planes (of the input's precision) :func:`gst3d` allocates besides its input and output.

    For a block of ``n0`` planes, a tensor smoothing of ``tensor_taps`` taps and ``batch``
    output planes at once.
    """
    ring = min(tensor_taps + batch - 1, n0)
    rings = 2 * min(3, n0) if kernel == "d2geo" else 0
    return 6 * ring + 6 + 7 * batch + rings


def batch_size(n0: int, kernel: str, tensor_taps: int) -> int:
    """Output planes to smooth at once: the largest of :data:`BATCHES` that the block affords.

    The largest whose workspace (:func:`workspace_planes`) is at most two planes per plane of
    the block, else 1. A batch shares the product planes its outputs read: with 4, each product
    is read from memory ~4 times instead of 13 (``rho=2``), which saves ~15% of the time.
    """
    for batch in BATCHES:
        if workspace_planes(n0, kernel, tensor_taps, batch) <= 2 * n0:
            return batch
    return 1
