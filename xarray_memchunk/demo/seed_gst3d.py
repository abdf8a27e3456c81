"""The seed project's GST3D as a user would bring it: a plain NumPy function, ``eigh`` per voxel.

``shared/seeds/memory-aware-chunking-notebook.txt`` computed dip from the gradient structure
tensor with NumPy gradients, Gaussian smoothing, a stack of the nine tensor components and
``numpy.linalg.eigh`` on every voxel's 3x3 matrix. Its tasks hold about 240 bytes per voxel:
Dask's auto chunks and the seed's own model-based 159^3 chunks killed 1.5 GB workers. Nothing
here is tuned for memory: it is the function memchunk must plan safely with no model written
by hand (its ``memory_model`` is left out, so it calibrates itself).
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from ..operators.blockwise import BlockwiseOperator

__all__ = ["SEED_DEPTH", "seed_gst3d", "seed_gst3d_dip"]

#: Halo per side: the derivative's 1, the gradient smoothing's radius 3 and the tensor
#: smoothing's radius 6 (Gaussian scales 1 and 2, truncated at 3 standard deviations).
SEED_DEPTH = 10


def seed_gst3d_dip(block: np.ndarray) -> np.ndarray:
    """Dip in degrees (0 = flat) of a block whose last three axes are (inline, crossline, sample).

    Gradients of the smoothed amplitudes, the 3x3 structure tensor of every voxel smoothed
    component by component, ``numpy.linalg.eigh``, and the angle of the principal eigenvector
    from vertical.
    """
    x = ndimage.gaussian_filter(block.astype(np.float32), 1.0, truncate=3.0)
    gradients = np.gradient(x)
    tensor = np.empty((*x.shape, 3, 3), dtype=np.float32)
    for i in range(3):
        for j in range(i, 3):
            product = ndimage.gaussian_filter(gradients[i] * gradients[j], 2.0, truncate=3.0)
            tensor[..., i, j] = product
            tensor[..., j, i] = product
    _, vectors = np.linalg.eigh(tensor)
    principal = vectors[..., :, -1]
    return np.degrees(np.arccos(np.clip(np.abs(principal[..., 2]), 0.0, 1.0))).astype(np.float32)


#: The seed's GST3D as a self-calibrating operator over (inline, crossline, sample).
seed_gst3d = BlockwiseOperator(
    "seed-gst3d",
    seed_gst3d_dip,
    depth=dict.fromkeys(("inline", "crossline", "sample"), SEED_DEPTH),
    dtype="float32",
    description="the seed project's GST3D dip: NumPy gradients, smoothing, eigh per voxel",
)
