"""A user's NumPy functions for the randomized trials, registered as memchunk operators.

``temporaries``: an elementwise function that holds several float64 temporaries at once, as
plain NumPy code does (no memory model written: memchunk measures it). The seed's GST3D
(``seed-gst3d``) is registered by :mod:`xarray_memchunk.demo.seed_gst3d`'s operator here too.
"""

from __future__ import annotations

import numpy as np

import xarray_memchunk as xm
from xarray_memchunk.demo.seed_gst3d import seed_gst3d

__all__ = ["temporaries"]


def temporaries(block: np.ndarray) -> np.ndarray:
    """A smooth energy of ``block``, computed in float64 with five temporaries alive at once."""
    x = block.astype(np.float64)
    wave = np.sin(x) * np.cos(x)
    decay = np.exp(-x * x)
    spread = np.log1p(np.abs(x))
    return (wave + decay * spread).astype(block.dtype)


xm.register_operator(xm.BlockwiseOperator("temporaries", temporaries), overwrite=True)
xm.register_operator(seed_gst3d, overwrite=True)
