"""The ``memchunk demo`` experiment: GST3D dip, Dask's automatic chunks against memchunk's plan.

:mod:`~xarray_memchunk.demo.seed_gst3d` is the seed project's GST3D as a user writes it (a plain
NumPy function with no memory model); :mod:`~xarray_memchunk.demo.experiment` runs it and the
built-in GST3D on fresh ``LocalCluster``s and tabulates what the workers did.
"""
