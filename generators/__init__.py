"""Synthetic dataset writers (generate_dataset and the writer table: not built yet; see synth.py)."""
