"""GST3D on one NumPy block in a single compiled pass (Numba): filters, tensor, eigen-analysis.

The block is swept plane by plane along its first axis (inline). For each plane the three
gradients are computed and their six products kept in a ring of planes; as soon as the
products a batch of output planes needs are there (``2 r_rho + 1`` planes around each), the
batch is smoothed, solved and written. Besides the input and the output, :func:`gst3d` holds
(:func:`workspace_planes`):

- the ring: ``6 (2 r_rho + batch)`` planes (6 x 16 for the default ``rho=2, truncate=3`` and a
  batch of 4; never more planes than the block has);
- ``6 + 7 batch`` planes of temporaries (gradients; per output plane of the batch, one plane
  smoothed along axis 0 and the six tensor components); d2geo adds 2 x 3 planes;

all in the input's precision: ~34 MB for 256 x 256 planes of float32. :func:`batch_size` takes
a batch of 4, 2 or 1 output planes, the largest whose workspace is at most two planes per plane
of the block. The peak, input and float32 output included, is ``8 + 4 W / n0`` bytes per voxel
of float32 for a block of ``n0`` planes and a workspace of ``W`` planes: ~10 for 256 planes,
~12 for 128, ~15 for 64, ~19 for 32, ~27 for 19 (a chunk of 1 plane and its halo), and 36 at 13
planes, what the unfused SciPy pipeline needs on any block; thinner blocks need more (the ring
and temporaries of a plane do not shrink: 84 bytes per voxel for a single plane).

The arithmetic is SciPy's, operation for operation, so the tensor is bit-identical to the one
``scipy.ndimage`` computes from the same input:

- each 1-D pass is :func:`scipy.ndimage.correlate1d`'s: values read in double precision,
  weights in double, the centre tap first and then pairs ``(left + right) * w`` from the
  outermost in (``(left - right) * w`` for an antisymmetric kernel), and the result rounded to
  the input's precision between passes, with ``reflect`` boundaries (``d c b a | a b c d``,
  repeated as often as a short axis needs);
- the passes run in the order SciPy runs them: :func:`scipy.ndimage.gaussian_filter` filters
  axes 0, 1, 2 in turn, and d2geo's gradient is its derivative along its axis followed by the
  smoothing along the other two in increasing order;
- the products are rounded to the input's precision, as ``np.multiply`` rounds them;
- the weights are :func:`scipy.ndimage.gaussian_filter1d`'s (:func:`gaussian_weights`).

The eigen-analysis is the closed form the unfused NumPy pipeline solved slab by slab
(``benchmarks/harness/gst3d_reference.py``, the tests' reference), in float64, voxel by voxel,
with the same formulas in the same order: each tensor divided by its trace, the trigonometric
eigenvalues (Smith, 1961), the largest of three cross products of rows of ``A - l1 I`` as the
principal vector, a degenerate tensor reported as vertical. ``acos``, ``cos`` and ``atan2``
are FDLIBM's (< 1 ulp), which may differ from NumPy's by an ulp. Every tap is multiplied, zero
weights included, so a NaN reaches exactly the voxels within the halo, for every attribute
(planarity and linearity too).

Compiled on first use (~12 s for float32 to float32, ~5 s more per other output dtype, ~10 s
more for float64 input) and cached on disk (``cache=True``: later processes load it in ~0.3 s);
the compiled functions release the GIL, so Dask's threads run blocks in parallel. No
fast-math: the vectorised loops keep IEEE semantics and the order of operations above.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .workspace import (
    batch_size,
    correlation_weights,
    gaussian_weights,
    symmetry,
    workspace_planes,
)

__all__ = [
    "ATTRIBUTE_CODES",
    "KERNEL_CODES",
    "batch_size",
    "correlation_weights",
    "gaussian_weights",
    "gst3d",
    "structure_tensor",
    "warm",
    "workspace_planes",
]

#: Attribute names to the codes the compiled kernel takes.
ATTRIBUTE_CODES = {"dip": 0, "azimuth": 1, "planarity": 2, "linearity": 3}
#: Kernel names to the codes the compiled kernel takes.
KERNEL_CODES = {"gaussian": 0, "d2geo": 1}

#: Doubles in the accumulator of a 1-D pass across planes or rows (8 KiB: stays in L1).
ACCUMULATOR = 1024
_JIT = {"cache": True, "fastmath": False, "nogil": True, "error_model": "numpy"}
_RAD2DEG = 180.0 / np.pi
_THIRD_TURN = 2.0 * np.pi / 3.0


# --- 1-D passes, as scipy.ndimage.correlate1d computes them ----------------------------------


@njit(**_JIT)
def _reflect(i, n):
    """Index ``i`` of a line of ``n`` extended by ``reflect`` (period ``2 n``)."""
    period = 2 * n
    i = i % period
    if i >= n:
        i = period - 1 - i
    return i


@njit(**_JIT)
def _combine_batch(src, idx, count, w, sym, out, acc):
    """``out[b] = sum_t w[t] * src[idx[b, t]]`` for ``b < count``, in SciPy's order.

    Each output row is a correlation along the first axis: ``idx[b, t]`` is the row of
    ``src`` of the tap at offset ``t - len(w) // 2``. Sums in double, the centre tap first,
    then pairs ``(left +- right) * w`` from the outermost in (``scipy.ndimage.correlate1d``).
    Block by block of ``len(acc)`` elements, all outputs of a block at once, so rows shared by
    several outputs are read from memory once. ``out`` must not share memory with ``src``.
    """
    size = w.shape[0]
    half = size // 2
    n = out.shape[1]
    block = acc.shape[0]
    for start in range(0, n, block):
        m = min(block, n - start)
        stop = start + m
        for b in range(count):
            # views indexed from 0 by range(): no negative-index wraparound, so loops vectorise
            dst = out[b, start:stop]
            if sym != 0:
                centre = src[idx[b, half], start:stop]
                w0 = w[half]
                for k in range(m):
                    acc[k] = np.float64(centre[k]) * w0
                for t in range(half):
                    left = src[idx[b, t], start:stop]
                    right = src[idx[b, size - 1 - t], start:stop]
                    wt = w[t]
                    if sym > 0:
                        for k in range(m):
                            acc[k] += (np.float64(left[k]) + np.float64(right[k])) * wt
                    else:
                        for k in range(m):
                            acc[k] += (np.float64(left[k]) - np.float64(right[k])) * wt
            else:
                last = src[idx[b, size - 1], start:stop]
                wl = w[size - 1]
                for k in range(m):
                    acc[k] = np.float64(last[k]) * wl
                for t in range(size - 1):
                    row = src[idx[b, t], start:stop]
                    wt = w[t]
                    for k in range(m):
                        acc[k] += np.float64(row[k]) * wt
            for k in range(m):
                dst[k] = acc[k]


@njit(**_JIT)
def _combine(src, idx, w, sym, out, acc):
    """One output row: :func:`_combine_batch` with ``idx`` a 1-D array of rows."""
    _combine_batch(
        src, idx.reshape((1, idx.shape[0])), 1, w, sym, out.reshape((1, out.shape[0])), acc
    )


@njit(**_JIT)
def _pass_rows(src, w, sym, out, idx, acc):
    """Correlate a plane ``src`` (rows, columns) with ``w`` along its rows' axis into ``out``."""
    n = src.shape[0]
    size = w.shape[0]
    half = size // 2
    for r in range(n):
        for t in range(size):
            idx[t] = _reflect(r + t - half, n)
        _combine(src, idx, w, sym, out[r], acc)


@njit(**_JIT)
def _pass_last(src, w, sym, out, ext, acc):
    """Correlate a plane ``src`` with ``w`` along its last (contiguous) axis; in place is fine."""
    rows, n = src.shape
    size = w.shape[0]
    half = size // 2
    for r in range(rows):
        row = src[r]
        for i in range(half):
            ext[i] = row[_reflect(i - half, n)]
        for i in range(n):
            ext[half + i] = row[i]
        for i in range(half + n, n + size - 1):
            ext[i] = row[_reflect(i - half, n)]
        if sym != 0:
            centre = ext[half : half + n]
            w0 = w[half]
            for k in range(n):
                acc[k] = centre[k] * w0
            for t in range(half):
                wt = w[t]
                left = ext[t : t + n]
                right = ext[size - 1 - t : size - 1 - t + n]
                if sym > 0:
                    for k in range(n):
                        acc[k] += (left[k] + right[k]) * wt
                else:
                    for k in range(n):
                        acc[k] += (left[k] - right[k]) * wt
        else:
            last = ext[size - 1 : size - 1 + n]
            wl = w[size - 1]
            for k in range(n):
                acc[k] = last[k] * wl
            for t in range(size - 1):
                wt = w[t]
                row = ext[t : t + n]
                for k in range(n):
                    acc[k] += row[k] * wt
        dst = out[r]
        for k in range(n):
            dst[k] = acc[k]


@njit(**_JIT)
def _plane_taps(centre, size, n, idx):
    """Planes (reflected) of the ``size`` taps centred on ``centre``, into ``idx``."""
    half = size // 2
    for t in range(size):
        idx[t] = _reflect(centre + t - half, n)


# --- the pipeline -----------------------------------------------------------------------------


@njit(**_JIT)
def _ensure_plane(ring, tags, plane, x3, transform, w, sym, idx, ext, acc):
    """Slot of ``ring`` holding d2geo's in-plane derivative of input ``plane``, computed if absent.

    ``transform`` 1: along rows (axis 1); 2: along the last axis.
    """
    slot = plane % tags.shape[0]
    if tags[slot] != plane:
        n1, n2 = x3.shape[1], x3.shape[2]
        dst = ring[slot].reshape((n1, n2))
        if transform == 1:
            _pass_rows(x3[plane], w, sym, dst, idx, acc)
        else:
            _pass_last(x3[plane], w, sym, dst, ext, acc)
        tags[slot] = plane
    return slot


@njit(**_JIT)
def _gradients(k, x3, kernel, wd, sd, ws, ss, work, rings, ring_tags, idx, taps, ext, acc):
    """The three gradient planes of input plane ``k`` into ``work[3:6]``.

    The passes and their order are those of ``kernels._gradient`` on the whole block.
    """
    n0, n1, n2 = x3.shape
    npix = n1 * n2
    x2 = x3.reshape((n0, npix))
    a = work[0]
    b = work[1]
    t2 = work[2].reshape((n1, n2))
    gx = work[3].reshape((n1, n2))
    gy = work[4].reshape((n1, n2))
    gz = work[5].reshape((n1, n2))
    size = wd.shape[0]
    if kernel == 0:
        # gaussian_filter: axes 0, 1, 2 in turn; S0 x is shared by gy and gz
        _plane_taps(k, size, n0, taps)
        _combine(x2, taps, wd, sd, a, acc)
        _combine(x2, taps, ws, ss, b, acc)
        a2 = a.reshape((n1, n2))
        b2 = b.reshape((n1, n2))
        _pass_rows(a2, ws, ss, t2, idx, acc)
        _pass_last(t2, ws, ss, gx, ext, acc)
        _pass_rows(b2, wd, sd, t2, idx, acc)
        _pass_last(t2, ws, ss, gy, ext, acc)
        _pass_rows(b2, ws, ss, t2, idx, acc)
        _pass_last(t2, wd, sd, gz, ext, acc)
    else:
        # d2geo: the derivative along the axis, then the smoothing along the others, in order
        _plane_taps(k, size, n0, taps)
        _combine(x2, taps, wd, sd, a, acc)
        _pass_rows(a.reshape((n1, n2)), ws, ss, t2, idx, acc)
        _pass_last(t2, ws, ss, gx, ext, acc)
        for t in range(size):  # D1 x of the planes around k, then S0, then S2
            plane = _reflect(k + t - size // 2, n0)
            taps[t] = _ensure_plane(rings[0], ring_tags[0], plane, x3, 1, wd, sd, idx, ext, acc)
        _combine(rings[0], taps, ws, ss, b, acc)
        _pass_last(b.reshape((n1, n2)), ws, ss, gy, ext, acc)
        for t in range(size):  # D2 x, then S0, then S1
            plane = _reflect(k + t - size // 2, n0)
            taps[t] = _ensure_plane(rings[1], ring_tags[1], plane, x3, 2, wd, sd, idx, ext, acc)
        _combine(rings[1], taps, ws, ss, b, acc)
        _pass_rows(b.reshape((n1, n2)), ws, ss, gz, idx, acc)


@njit(**_JIT)
def _ensure_products(
    k, x3, kernel, wd, sd, ws, ss, products, tags, work, rings, ring_tags, idx, taps, ext, acc
):
    """Slot of the product ring holding the six gradient products of plane ``k``."""
    slot = k % tags.shape[0]
    if tags[slot] != k:
        _gradients(k, x3, kernel, wd, sd, ws, ss, work, rings, ring_tags, idx, taps, ext, acc)
        gx = work[3]
        gy = work[4]
        gz = work[5]
        xx = products[0, slot]
        yy = products[1, slot]
        zz = products[2, slot]
        xy = products[3, slot]
        xz = products[4, slot]
        yz = products[5, slot]
        for i in range(gx.shape[0]):
            u = gx[i]
            v = gy[i]
            s = gz[i]
            xx[i] = u * u  # in the input's precision, as np.multiply(gx, gx, out=buf)
            yy[i] = v * v
            zz[i] = s * s
            xy[i] = u * v
            xz[i] = u * s
            yz[i] = v * s
        tags[slot] = k
    return slot


# --- eigen-analysis ----------------------------------------------------------------------------
#
# acos, cos and atan2 are FDLIBM's (as in FreeBSD's and musl's libm: < 1 ulp), written without
# branches so that the loop over a plane's voxels vectorises: calls to the C library would keep
# it scalar, ~70 ns per voxel instead of ~16, more than all the filters together. The constants
# are FDLIBM's.

_PI = 3.14159265358979311600e00
_PIO2_HI = 1.57079632679489655800e00
_PIO2_LO = 6.12323399573676603587e-17
_PI_LO = 1.22464679914735317720e-16
_PS = (
    1.66666666666666657415e-01,
    -3.25565818622400915405e-01,
    2.01212532134862925881e-01,
    -4.00555345006794114027e-02,
    7.91534994289814532176e-04,
    3.47933107596021167570e-05,
)
_QS = (
    -2.40339491173441421878e00,
    2.02094576023350569471e00,
    -6.88283971605453293030e-01,
    7.70381505559019352791e-02,
)
_INVPIO2 = 6.36619772367581382433e-01
_PIO2_1 = 1.57079632673412561417e00  # first 33 bits of pi/2
_PIO2_2 = 6.07710050630396597660e-11  # next 33 bits
_PIO2_2T = 2.02226624879595063154e-21  # pi/2 - (_PIO2_1 + _PIO2_2)
_C = (
    4.16666666666666019037e-02,
    -1.38888888888741095749e-03,
    2.48015872894767294178e-05,
    -2.75573143513906633035e-07,
    2.08757232129817482790e-09,
    -1.13596475577881948265e-11,
)
_S = (
    -1.66666666666666324348e-01,
    8.33333333332248946124e-03,
    -1.98412698298579493134e-04,
    2.75573137070700676789e-06,
    -2.50507602534068634195e-08,
    1.58969099521155010221e-10,
)
_ATANHI = (
    4.63647609000806093515e-01,
    7.85398163397448278999e-01,
    9.82793723247329054082e-01,
    1.57079632679489655800e00,
)
_ATANLO = (
    2.26987774529616870924e-17,
    3.06161699786838301793e-17,
    1.39033110312309984516e-17,
    6.12323399573676603587e-17,
)
_AT = (
    3.33333333333329318027e-01,
    -1.99999999998764832476e-01,
    1.42857142725034663711e-01,
    -1.11111104054623557880e-01,
    9.09088713343650656196e-02,
    -7.69187620504482999495e-02,
    6.66107313738753120669e-02,
    -5.83357013379057348645e-02,
    4.97687799461593236017e-02,
    -3.65315727442169155270e-02,
    1.62858201153657823623e-02,
)
_SPLIT = 134217729.0  # 2**27 + 1: Veltkamp's split of a double into two halves

# Inlined into their callers, whose error model then applies: call them from functions
# compiled with error_model="numpy" (IEEE division: x / 0 is inf or NaN, not an exception).
_INLINE = {**_JIT, "inline": "always"}


@njit(**_INLINE)
def _acos(x):
    """``acos(x)`` for ``|x| <= 1`` (NaN for NaN), FDLIBM's ``__ieee754_acos``."""
    ax = abs(x)
    small = ax < 0.5
    z = x * x if small else (1.0 - ax) * 0.5
    p = z * (_PS[0] + z * (_PS[1] + z * (_PS[2] + z * (_PS[3] + z * (_PS[4] + z * _PS[5])))))
    q = 1.0 + z * (_QS[0] + z * (_QS[1] + z * (_QS[2] + z * _QS[3])))
    r = p / q
    s = math.sqrt(z)
    near_zero = _PIO2_HI - (x - (_PIO2_LO - x * r))
    near_minus_one = _PI - 2.0 * (s + (r * s - _PIO2_LO))
    # near one: s split into a 26-bit head df (df * df is exact) and a correction
    c = s * _SPLIT
    df = c - (c - s)
    denominator = s + df if s > 0.0 else 1.0
    correction = (z - df * df) / denominator
    near_one = 2.0 * (df + (r * s + correction))
    if small:
        return near_zero
    if x < 0.0:
        return near_minus_one
    return near_one


@njit(**_INLINE)
def _kernel_cos(x, y):
    """``cos(x + y)`` for ``|x| <= pi/4``, ``y`` the tail of ``x`` (FDLIBM's ``__kernel_cos``)."""
    z = x * x
    w = z * z
    r = z * (_C[0] + z * (_C[1] + z * _C[2])) + w * w * (_C[3] + z * (_C[4] + z * _C[5]))
    hz = 0.5 * z
    w = 1.0 - hz
    return w + (((1.0 - w) - hz) + (z * r - x * y))


@njit(**_INLINE)
def _kernel_sin(x, y):
    """``sin(x + y)`` for ``|x| <= pi/4`` (FDLIBM's ``__kernel_sin`` with a tail)."""
    z = x * x
    w = z * z
    r = _S[1] + z * (_S[2] + z * _S[3]) + z * w * (_S[4] + z * _S[5])
    v = z * x
    return x - ((z * (0.5 * y - v * r) - y) - v * _S[0])


@njit(**_INLINE)
def _cos(x):
    """``cos(x)`` for ``0 <= x <= pi`` (NaN for NaN): FDLIBM's reduction by ``n pi / 2``."""
    fn = math.floor(x * _INVPIO2 + 0.5)  # 0, 1 or 2
    t = x - fn * _PIO2_1  # exact
    w = fn * _PIO2_2
    r = t - w
    w = fn * _PIO2_2T - ((t - r) - w)
    y0 = r - w
    y1 = (r - y0) - w
    kc = _kernel_cos(y0, y1)
    ks = _kernel_sin(y0, y1)
    if fn == 1.0:
        return -ks
    if fn == 2.0:
        return -kc
    return kc


@njit(**_INLINE)
def _atan_abs(ax):
    """``atan(ax)`` for ``ax >= 0`` (NaN for NaN), FDLIBM's ``atan``."""
    if ax < 0.4375:
        t, hi, lo = ax, 0.0, 0.0
    elif ax < 0.6875:
        t, hi, lo = (2.0 * ax - 1.0) / (2.0 + ax), _ATANHI[0], _ATANLO[0]
    elif ax < 1.1875:
        t, hi, lo = (ax - 1.0) / (ax + 1.0), _ATANHI[1], _ATANLO[1]
    elif ax < 2.4375:
        t, hi, lo = (ax - 1.5) / (1.0 + 1.5 * ax), _ATANHI[2], _ATANLO[2]
    else:  # NaN too
        t, hi, lo = -1.0 / ax, _ATANHI[3], _ATANLO[3]
    z = t * t
    w = z * z
    s1 = z * (_AT[0] + w * (_AT[2] + w * (_AT[4] + w * (_AT[6] + w * (_AT[8] + w * _AT[10])))))
    s2 = w * (_AT[1] + w * (_AT[3] + w * (_AT[5] + w * (_AT[7] + w * _AT[9]))))
    reduced = hi - ((t * (s1 + s2) - lo) - t)
    return t - t * (s1 + s2) if ax < 0.4375 else reduced


@njit(**_INLINE)
def _atan2(y, x):
    """``atan2(y, x)`` for finite ``x, y`` (NaN for NaN), FDLIBM's ``__ieee754_atan2``."""
    z = _atan_abs(abs(y / x))
    y_negative = math.copysign(1.0, y) < 0.0
    x_negative = math.copysign(1.0, x) < 0.0
    if x_negative:
        z = _PI - (z - _PI_LO)
    if y == 0.0:  # +-0 for x >= +0, +-pi for x <= -0
        z = _PI if x_negative else 0.0
    elif x == 0.0:
        z = _PIO2_HI + _PIO2_LO
    return -z if y_negative else z


@njit(**_INLINE)
def _clip_unit(v):
    """``np.clip(v, -1, 1)``: NaN stays NaN."""
    if v < -1.0:
        return -1.0
    if v > 1.0:
        return 1.0
    return v


@njit(**_INLINE)
def _normalised(tensor, i):
    """Voxel ``i``'s six components in float64, divided by the trace; and the trace."""
    a11 = np.float64(tensor[0, i])
    a22 = np.float64(tensor[1, i])
    a33 = np.float64(tensor[2, i])
    a12 = np.float64(tensor[3, i])
    a13 = np.float64(tensor[4, i])
    a23 = np.float64(tensor[5, i])
    trace = abs(a11 + a22 + a33)
    scale = trace if trace > 0 else 1.0
    return a11 / scale, a22 / scale, a33 / scale, a12 / scale, a13 / scale, a23 / scale, scale


@njit(**_INLINE)
def _eigen_terms(a11, a22, a33, a12, a13, a23):
    """``q``, ``p`` and ``phi`` of the trigonometric solution (the reference's ``_eigenvalues``)."""
    q = (a11 + a22 + a33) / 3.0
    p1 = a12 * a12 + a13 * a13 + a23 * a23
    b11 = a11 - q
    b22 = a22 - q
    b33 = a33 - q
    p = math.sqrt((b11 * b11 + b22 * b22 + b33 * b33 + 2.0 * p1) / 6.0)
    safe = p if p > 0 else 1.0
    det = (
        b11 * (b22 * b33 - a23 * a23)
        - a12 * (a12 * b33 - a23 * a13)
        + a13 * (a12 * a23 - b22 * a13)
    )
    r = _clip_unit(det / (2.0 * (safe * safe * safe)))
    return q, p, _acos(r) / 3.0


@njit(**_INLINE)
def _principal(a11, a22, a33, a12, a13, a23, l1):
    """Unit eigenvector of ``l1``, sample component >= 0 (the reference's ``_principal_vector``).

    The largest of the cross products of the rows of ``A - l1 I``, the first on ties; the
    vertical (x, y signed zeros) where all are below 1e-30.
    """
    r00 = a11 - l1
    r11 = a22 - l1
    r22 = a33 - l1
    # rows r0 = (r00, a12, a13), r1 = (a12, r11, a23), r2 = (a13, a23, r22)
    v0 = a12 * a23 - a13 * r11
    v1 = a13 * a12 - r00 * a23
    v2 = r00 * r11 - a12 * a12
    best = v0 * v0 + v1 * v1 + v2 * v2
    w0 = a12 * r22 - a13 * a23
    w1 = a13 * a13 - r00 * r22
    w2 = r00 * a23 - a12 * a13
    norm = w0 * w0 + w1 * w1 + w2 * w2
    take = norm > best
    v0 = w0 if take else v0
    v1 = w1 if take else v1
    v2 = w2 if take else v2
    best = norm if take else best
    w0 = r11 * r22 - a23 * a23
    w1 = a23 * a13 - a12 * r22
    w2 = a12 * a23 - r11 * a13
    norm = w0 * w0 + w1 * w1 + w2 * w2
    take = norm > best
    v0 = w0 if take else v0
    v1 = w1 if take else v1
    v2 = w2 if take else v2
    best = norm if take else best
    norm = math.sqrt(best)
    degenerate = norm <= 1e-30
    scale = 0.0 if degenerate else 1.0 / (1.0 if degenerate else norm)
    vx = v0 * scale
    vy = v1 * scale
    vz = 1.0 if degenerate else v2 * scale
    sign = -1.0 if vz < 0 else 1.0
    return vx * sign, vy * sign, vz * sign


@njit(**_JIT)
def _eigen_plane(tensor, attribute, out):
    """An attribute of each voxel from its six tensor components, as the reference computes it.

    NaN components give NaN for every attribute (``principal_eigen``'s planarity would be 0).
    """
    n = out.shape[0]
    if attribute == 0:
        for i in range(n):
            a11, a22, a33, a12, a13, a23, _ = _normalised(tensor, i)
            q, p, phi = _eigen_terms(a11, a22, a33, a12, a13, a23)
            l1 = q + 2.0 * p * _cos(phi)
            _, _, z = _principal(a11, a22, a33, a12, a13, a23, l1)
            out[i] = _acos(_clip_unit(z)) * _RAD2DEG
    elif attribute == 1:
        for i in range(n):
            a11, a22, a33, a12, a13, a23, _ = _normalised(tensor, i)
            q, p, phi = _eigen_terms(a11, a22, a33, a12, a13, a23)
            l1 = q + 2.0 * p * _cos(phi)
            x, y, _ = _principal(a11, a22, a33, a12, a13, a23, l1)
            angle = _atan2(x, y) * _RAD2DEG
            # np.mod(angle, 360): |angle| <= 180, so fmod is angle itself; +0 for a zero
            out[i] = angle + 360.0 if angle < 0.0 else (0.0 if angle == 0.0 else angle)
    else:
        for i in range(n):
            a11, a22, a33, a12, a13, a23, scale = _normalised(tensor, i)
            q, p, phi = _eigen_terms(a11, a22, a33, a12, a13, a23)
            l1 = q + 2.0 * p * _cos(phi)
            l3 = q + 2.0 * p * _cos(phi + _THIRD_TURN)
            l2 = 3.0 * q - l1 - l3
            e1 = l1 * scale
            e2 = l2 * scale
            e3 = l3 * scale
            top = e1 - e2 if attribute == 2 else e2 - e3
            value = top / (e1 if e1 > 0 else 1.0)
            # 0 where l1 <= 0 (a zero tensor), NaN where l1 is NaN
            out[i] = value if e1 > 0 or e1 != e1 else 0.0


@njit(**_JIT)
def _gst3d(
    x3, kernel, wd, sd, ws, ss, wr, sr, attribute, out3, tensor_out, products, work, rings, batch
):
    """The whole pipeline on a C-contiguous block ``x3`` into ``out3`` (see the module doc).

    ``batch`` output planes are smoothed at once: the product planes they share are read once.
    ``attribute`` -1 writes the six tensor components into ``tensor_out`` (6, planes, pixels)
    instead (:func:`structure_tensor`).
    """
    n0, n1, n2 = x3.shape
    npix = n1 * n2
    size_r = wr.shape[0]
    half_r = size_r // 2
    tags = np.full(products.shape[1], -1, np.int64)
    ring_tags = np.full((2, rings.shape[1]), -1, np.int64)
    longest = max(wd.shape[0], ws.shape[0], size_r)
    idx = np.empty(longest, np.int64)
    taps = np.empty(longest, np.int64)
    slots = np.empty((batch, size_r), np.int64)
    ext = np.empty(n2 + longest - 1, np.float64)
    acc = np.empty(max(n2, ACCUMULATOR), np.float64)
    t2 = work[2].reshape((n1, n2))
    smoothed = work[6 : 6 + batch]  # axis 0 done, one plane per output of the batch
    tensor = work[6 + batch :].reshape((batch, 6, npix))
    for first in range(0, n0, batch):
        count = min(batch, n0 - first)
        for b in range(count):
            for t in range(size_r):
                k = _reflect(first + b + t - half_r, n0)
                slots[b, t] = _ensure_products(
                    k,
                    x3,
                    kernel,
                    wd,
                    sd,
                    ws,
                    ss,
                    products,
                    tags,
                    work,
                    rings,
                    ring_tags,
                    idx,
                    taps,
                    ext,
                    acc,
                )
        for c in range(6):  # smoothing: axis 0 (across the ring), 1, 2, as gaussian_filter
            _combine_batch(products[c], slots, count, wr, sr, smoothed, acc)
            for b in range(count):
                _pass_rows(smoothed[b].reshape((n1, n2)), wr, sr, t2, idx, acc)
                _pass_last(t2, wr, sr, tensor[b, c].reshape((n1, n2)), ext, acc)
        for b in range(count):
            if attribute < 0:
                for c in range(6):
                    tensor_out[c, first + b] = tensor[b, c]
            else:
                _eigen_plane(tensor[b], attribute, out3[first + b].reshape(npix))


def _run(x, kernel, sigma, rho, truncate, attribute, out, tensor_out) -> None:
    """Allocate the workspace (:func:`workspace_planes`) and run :func:`_gst3d` on ``x``."""
    wd, ws, wr = correlation_weights(kernel, sigma, rho, truncate)
    n0, n1, n2 = x.shape
    npix = n1 * n2
    batch = batch_size(n0, kernel, wr.shape[0])
    products = np.empty((6, min(wr.shape[0] + batch - 1, n0), npix), dtype=x.dtype)
    # a, b, t, gx, gy, gz; then per output plane of a batch: one plane smoothed along axis 0,
    # and its six tensor components
    work = np.empty((6 + 7 * batch, npix), dtype=x.dtype)
    ring = min(wd.shape[0], n0) if kernel == "d2geo" else 0
    rings = np.empty((2, ring, npix), dtype=x.dtype)
    _gst3d(
        x,
        KERNEL_CODES[kernel],
        wd,
        symmetry(wd),
        ws,
        symmetry(ws),
        wr,
        symmetry(wr),
        attribute,
        out,
        tensor_out,
        products,
        work,
        rings,
        batch,
    )


def _compute_input(block: np.ndarray) -> np.ndarray:
    """``block`` C-contiguous in the compute dtype: float64 stays, anything else is float32."""
    dtype = np.float64 if block.dtype == np.float64 else np.float32
    return np.ascontiguousarray(block, dtype=dtype)


def structure_tensor(
    block: np.ndarray,
    *,
    kernel: str = "gaussian",
    sigma: float = 1.0,
    rho: float = 2.0,
    truncate: float = 3.0,
) -> np.ndarray:
    """The six smoothed tensor components (xx, yy, zz, xy, xz, yz) the fused kernel solves.

    For tests and diagnostics: six volumes in the compute dtype, bit-identical to SciPy's.

    Returns
    -------
    numpy.ndarray
        Shape ``(6, *block.shape)``.
    """
    if block.ndim != 3:
        raise ValueError(f"expected a 3-D block, got {block.ndim} dimensions")
    if kernel not in KERNEL_CODES:
        raise ValueError(f"kernel must be one of {tuple(KERNEL_CODES)}, got {kernel!r}")
    x = _compute_input(block)
    tensor = np.empty((6, *x.shape), dtype=x.dtype)
    if x.size:
        out = np.empty((0, 0, 0), dtype=x.dtype)
        _run(x, kernel, sigma, rho, truncate, -1, out, tensor.reshape(6, x.shape[0], -1))
    return tensor


def gst3d(
    block: np.ndarray,
    *,
    attribute: str = "dip",
    kernel: str = "gaussian",
    sigma: float = 1.0,
    rho: float = 2.0,
    truncate: float = 3.0,
    out_dtype: np.dtype | str = "float32",
) -> np.ndarray:
    """One GST3D attribute of a 3-D NumPy block, fused (see the module docstring).

    Parameters
    ----------
    block
        3-D amplitudes, axes (inline, crossline, sample). float64 is filtered in float64; any
        other dtype in float32 (SciPy's filters write float32 output for it too).
    attribute
        ``"dip"``, ``"azimuth"``, ``"planarity"`` or ``"linearity"``
        (:func:`~.kernels.gst3d_block`).
    kernel
        ``"gaussian"`` or ``"d2geo"``.
    sigma, rho, truncate
        Gaussian scales (voxels) and truncation (standard deviations); ``kernel="gaussian"``.
    out_dtype
        dtype of the result.

    Returns
    -------
    numpy.ndarray
        Same shape as ``block``.
    """
    if block.ndim != 3:
        raise ValueError(f"expected a 3-D block, got {block.ndim} dimensions")
    if attribute not in ATTRIBUTE_CODES:
        raise ValueError(f"attribute must be one of {tuple(ATTRIBUTE_CODES)}, got {attribute!r}")
    if kernel not in KERNEL_CODES:
        raise ValueError(f"kernel must be one of {tuple(KERNEL_CODES)}, got {kernel!r}")
    out_dtype = np.dtype(out_dtype)
    if block.size == 0:
        return np.empty(block.shape, dtype=out_dtype)
    x = _compute_input(block)
    direct = out_dtype in (np.float32, np.float64)
    out = np.empty(x.shape, dtype=out_dtype if direct else np.float64)
    tensor_out = np.empty((0, 0, 0), dtype=x.dtype)
    _run(x, kernel, sigma, rho, truncate, ATTRIBUTE_CODES[attribute], out, tensor_out)
    return out if direct else out.astype(out_dtype)


def kernel_loaded() -> bool:
    """Whether this process has compiled the kernel, or loaded it from Numba's cache.

    Any of its versions (float32 or float64 blocks): Numba's runtime, most of what a first
    task loads, is loaded with the first. False where Numba's JIT is disabled.
    """
    return bool(getattr(_gst3d, "signatures", ()))


def warm(dtype: np.dtype | str, out_dtype: np.dtype | str = "float32") -> None:
    """Compile the kernel for blocks of ``dtype`` (or load it from Numba's cache) in this process.

    The client calls it before a graph's tasks run, so that workers on this machine load the
    compiled code from the cache (~0.3 s, the runtime :data:`~.operator.FUSED_RUNTIME_BYTES`
    that plans count) instead of compiling it themselves, with LLVM's memory beside their
    tasks' (a worker that compiled it peaked ~100 MB above its plan in the tests).
    """
    gst3d(np.zeros((1, 1, 1), dtype=dtype), out_dtype=out_dtype)
