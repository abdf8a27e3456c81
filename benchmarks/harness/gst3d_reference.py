"""The CPU GST3D pipeline before the fused kernel: SciPy's filters and a NumPy eigen-solver.

``xarray_memchunk.operators.gst3d.kernels.gst3d_block`` ran this on NumPy blocks until the
fused (Numba) kernel replaced it; it stays here as the reference the fused kernel is tested
against (``tests/test_gst3d_fused.py``) and timed against (``benchmarks/gst3d_kernel.py``).
Its peak is ~36 bytes per voxel of float32: the input, three gradients, a product buffer and
six tensor components.

Eigen-analysis (:func:`principal_eigen`): closed form, without ``np.linalg.eigh``, slab by
slab. Eigenvalues: the trigonometric solution of the characteristic cubic (Smith, 1961).
Principal eigenvector: the largest of the three cross products of rows of ``A - l1 I``, which
span the plane orthogonal to it. Each matrix is divided by its trace before it is solved, so
the solution does not depend on the data's scale; eigenvalues are scaled back.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

__all__ = ["principal_eigen", "reference", "reference_tensor"]

ATTRIBUTES = ("dip", "azimuth", "planarity", "linearity")
D2GEO_DERIVATIVE = [-0.5, 0.0, 0.5]
D2GEO_SMOOTHING = [0.178947, 0.642105, 0.178947]
D2GEO_BOX = np.full(3, 1.0 / 3.0)


def _gradient(x, axis, kernel, sigma, truncate, dtype):
    if kernel == "d2geo":
        g = ndimage.correlate1d(x, D2GEO_DERIVATIVE, axis=axis, output=dtype, mode="reflect")
        for other in range(3):
            if other != axis:
                ndimage.correlate1d(g, D2GEO_SMOOTHING, axis=other, output=g, mode="reflect")
        return g
    order = [0, 0, 0]
    order[axis] = 1
    return ndimage.gaussian_filter(
        x, sigma, order=order, output=dtype, mode="reflect", truncate=truncate
    )


def _smooth(product, kernel, rho, truncate):
    out = np.empty_like(product)
    if kernel == "d2geo":
        ndimage.correlate1d(product, D2GEO_BOX, axis=0, output=out, mode="reflect")
        for axis in (1, 2):
            ndimage.correlate1d(out, D2GEO_BOX, axis=axis, output=out, mode="reflect")
    else:
        ndimage.gaussian_filter(product, rho, output=out, mode="reflect", truncate=truncate)
    return out


def reference_tensor(x, kernel="gaussian", sigma=1.0, rho=2.0, truncate=3.0):
    """The six smoothed components (xx, yy, zz, xy, xz, yz), in the compute dtype."""
    dtype = np.float64 if x.dtype == np.float64 else np.float32
    g = [_gradient(x, axis, kernel, sigma, truncate, dtype) for axis in range(3)]
    pairs = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))
    return [_smooth(np.multiply(g[i], g[j]), kernel, rho, truncate) for i, j in pairs]


def reference(x, attribute="dip", kernel="gaussian", sigma=1.0, rho=2.0, truncate=3.0):
    """The attribute in float64 from :func:`reference_tensor` and :func:`principal_eigen`."""
    components = [c.reshape(-1) for c in reference_tensor(x, kernel, sigma, rho, truncate)]
    out = np.empty(x.size)

    def vector(s, vx, vy, vz):
        sign = np.where(vz < 0, -1.0, 1.0)
        if attribute == "dip":
            out[s] = np.degrees(np.arccos(np.clip(vz * sign, -1.0, 1.0)))
        else:
            out[s] = np.mod(np.degrees(np.arctan2(vx * sign, vy * sign)), 360.0)

    def values(s, l1, l2, l3):
        safe = np.where(l1 > 0, l1, 1.0)
        value = (l1 - l2) / safe if attribute == "planarity" else (l2 - l3) / safe
        out[s] = np.where(l1 > 0, value, 0.0)

    if attribute in ("dip", "azimuth"):
        principal_eigen(components, out_vector=vector)
    else:
        principal_eigen(components, out_values=values)
    return out.reshape(x.shape)


#: Matrices per slab: 32768 x ~25 float64 temporaries is ~6.5 MiB.
SLAB = 32768


def _eigenvalues(a11, a22, a33, a12, a13, a23):
    """Eigenvalues l1 >= l2 >= l3 of symmetric 3x3 matrices given by their six components."""
    q = (a11 + a22 + a33) / 3.0
    p1 = a12 * a12 + a13 * a13 + a23 * a23
    b11, b22, b33 = a11 - q, a22 - q, a33 - q
    p = np.sqrt((b11 * b11 + b22 * b22 + b33 * b33 + 2.0 * p1) / 6.0)
    safe = np.where(p > 0, p, 1.0)
    det = (
        b11 * (b22 * b33 - a23 * a23)
        - a12 * (a12 * b33 - a23 * a13)
        + a13 * (a12 * a23 - b22 * a13)
    )
    r = np.clip(det / (2.0 * safe**3), -1.0, 1.0)
    phi = np.arccos(r) / 3.0
    l1 = q + 2.0 * p * np.cos(phi)
    l3 = q + 2.0 * p * np.cos(phi + 2.0 * np.pi / 3.0)
    l2 = 3.0 * q - l1 - l3
    return l1, l2, l3


def _principal_vector(a11, a22, a33, a12, a13, a23, l1):
    """Unit eigenvector of ``l1``, as three arrays (x, y, z)."""
    r0 = (a11 - l1, a12, a13)
    r1 = (a12, a22 - l1, a23)
    r2 = (a13, a23, a33 - l1)
    best = None
    best_norm = None
    for u, v in ((r0, r1), (r0, r2), (r1, r2)):
        c = (u[1] * v[2] - u[2] * v[1], u[2] * v[0] - u[0] * v[2], u[0] * v[1] - u[1] * v[0])
        norm = c[0] * c[0] + c[1] * c[1] + c[2] * c[2]
        if best is None:
            best, best_norm = c, norm
        else:
            take = norm > best_norm
            best = tuple(np.where(take, new, old) for new, old in zip(c, best, strict=True))
            best_norm = np.where(take, norm, best_norm)
    norm = np.sqrt(best_norm)
    degenerate = norm <= 1e-30
    scale = np.where(degenerate, 0.0, 1.0 / np.where(degenerate, 1.0, norm))
    x, y, z = (c * scale for c in best)
    # no defined direction (isotropic or zero tensor): report the vertical
    z = np.where(degenerate, 1.0, z)
    return x, y, z


def principal_eigen(components, out_vector=None, out_values=None, slab: int = SLAB) -> None:
    """Principal eigenvector and eigenvalues of symmetric 3x3 matrices, slab by slab.

    Parameters
    ----------
    components
        Six flat arrays ``(a11, a22, a33, a12, a13, a23)`` of equal length.
    out_vector
        Callable ``(slice, x, y, z)`` receiving the principal unit eigenvector of each slab
        (float64), sign not normalised; or None.
    out_values
        Callable ``(slice, l1, l2, l3)`` receiving the eigenvalues, descending; or None.
    slab
        Matrices processed at once.
    """
    n = components[0].shape[0]
    for start in range(0, n, slab):
        s = slice(start, min(n, start + slab))
        a = [np.asarray(c[s], dtype=np.float64) for c in components]
        trace = np.abs(a[0] + a[1] + a[2])
        scale = np.where(trace > 0, trace, 1.0)
        a = [c / scale for c in a]
        l1, l2, l3 = _eigenvalues(*a)
        if out_values is not None:
            out_values(s, l1 * scale, l2 * scale, l3 * scale)
        if out_vector is not None:
            out_vector(s, *_principal_vector(*a, l1))
