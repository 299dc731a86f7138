"""iobench: measure deep-learning ingest from HPC storage, end to end."""

__version__ = "0.1.0"
