"""Seismic data in: SEG-Y read lazily, and written to Zarr in chunks planned for the operator.

:mod:`~.segy` reads and writes SEG-Y; :mod:`~.ingest` writes it to Zarr.
"""
