"""Keeping payloads over time: erasure by crypto-shredding, retention and the Parquet archive.

:func:`~replayable.archive.erasure.erase` destroys a tenant's or a data
subject's data keys; :mod:`~replayable.archive.parquet` moves old runs'
payloads to Parquet files on any fsspec filesystem and reads them back on demand.
"""
