"""GST3D's eigen-analysis on a GPU: one fused CUDA kernel, six tensor components in, attribute out.

The CPU kernel (:mod:`.fused`) solves each voxel's matrix in a compiled loop. On a GPU the same
arithmetic runs as one
``cupy.ElementwiseKernel``: each thread reads the six components of its voxel, solves its
matrix in float64 registers and writes the attribute, so the solve needs no device memory
beyond its output. The code below is the CPU kernel's eigen-analysis, line for line: trace
normalisation, the trigonometric eigenvalues, the largest of three cross products, the
degenerate case reported as vertical, the same sign convention, and NaN components giving
NaN for every attribute (clipping keeps NaN, and NaN is not degenerate).
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["ATTRIBUTE_CODES", "gpu_attribute"]

#: Attribute names to the kernel's integer switch.
ATTRIBUTE_CODES = {"dip": 0, "azimuth": 1, "planarity": 2, "linearity": 3}

_PREAMBLE = r"""
__device__ double memchunk_clip_unit(double v) {  // np.clip(v, -1, 1): NaN stays NaN
    return v < -1.0 ? -1.0 : (v > 1.0 ? 1.0 : v);
}

__device__ double memchunk_gst3d(double a11, double a22, double a33,
                                 double a12, double a13, double a23, int attribute) {
    const double pi = 3.141592653589793;
    double trace = fabs(a11 + a22 + a33);
    double scale = trace > 0.0 ? trace : 1.0;
    a11 /= scale; a22 /= scale; a33 /= scale; a12 /= scale; a13 /= scale; a23 /= scale;
    double q = (a11 + a22 + a33) / 3.0;
    double p1 = a12 * a12 + a13 * a13 + a23 * a23;
    double b11 = a11 - q, b22 = a22 - q, b33 = a33 - q;
    double p = sqrt((b11 * b11 + b22 * b22 + b33 * b33 + 2.0 * p1) / 6.0);
    double safe = p > 0.0 ? p : 1.0;
    double det = b11 * (b22 * b33 - a23 * a23) - a12 * (a12 * b33 - a23 * a13)
                 + a13 * (a12 * a23 - b22 * a13);
    double r = memchunk_clip_unit(det / (2.0 * safe * safe * safe));
    double phi = acos(r) / 3.0;
    double l1 = q + 2.0 * p * cos(phi);
    double l3 = q + 2.0 * p * cos(phi + 2.0 * pi / 3.0);
    double l2 = 3.0 * q - l1 - l3;
    if (attribute >= 2) {
        l1 *= scale; l2 *= scale; l3 *= scale;
        if (l1 <= 0.0) return 0.0;  // a zero tensor; NaN stays NaN
        return attribute == 2 ? (l1 - l2) / l1 : (l2 - l3) / l1;
    }
    double r0[3] = {a11 - l1, a12, a13};
    double r1[3] = {a12, a22 - l1, a23};
    double r2[3] = {a13, a23, a33 - l1};
    const double* us[3] = {r0, r0, r1};
    const double* vs[3] = {r1, r2, r2};
    double best[3] = {0.0, 0.0, 0.0};
    double best_norm = 0.0;
    for (int i = 0; i < 3; ++i) {
        const double* u = us[i];
        const double* v = vs[i];
        double c0 = u[1] * v[2] - u[2] * v[1];
        double c1 = u[2] * v[0] - u[0] * v[2];
        double c2 = u[0] * v[1] - u[1] * v[0];
        double norm = c0 * c0 + c1 * c1 + c2 * c2;
        if (i == 0 || norm > best_norm) {
            best[0] = c0; best[1] = c1; best[2] = c2; best_norm = norm;
        }
    }
    double norm = sqrt(best_norm);
    bool degenerate = norm <= 1e-30;  // NaN is not degenerate: it stays NaN
    double inv = degenerate ? 0.0 : 1.0 / norm;
    double x = best[0] * inv, y = best[1] * inv, z = degenerate ? 1.0 : best[2] * inv;
    double sign = z < 0.0 ? -1.0 : 1.0;
    if (attribute == 0) {
        return acos(memchunk_clip_unit(z * sign)) * (180.0 / pi);
    }
    double azimuth = fmod(atan2(x * sign, y * sign) * (180.0 / pi), 360.0);
    return azimuth < 0.0 ? azimuth + 360.0 : (azimuth == 0.0 ? 0.0 : azimuth);  // +0, as the CPU
}
"""


@functools.cache
def _kernel() -> Any:
    import cupy

    return cupy.ElementwiseKernel(
        "T a11, T a22, T a33, T a12, T a13, T a23, int32 attribute",
        "O out",
        "out = (O)memchunk_gst3d((double)a11, (double)a22, (double)a33, (double)a12, "
        "(double)a13, (double)a23, attribute)",
        "memchunk_gst3d_attribute",
        preamble=_PREAMBLE,
    )


def gpu_attribute(components: list[Any], attribute: str, out: Any) -> None:
    """Write ``attribute`` of the matrices given by six CuPy component arrays into ``out``.

    Parameters
    ----------
    components
        ``(a11, a22, a33, a12, a13, a23)``, CuPy arrays of one shape and dtype.
    attribute
        One of :data:`ATTRIBUTE_CODES`.
    out
        CuPy array of the components' shape, any float dtype.
    """
    _kernel()(*components, ATTRIBUTE_CODES[attribute], out)
