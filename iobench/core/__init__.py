"""Contracts and shared machinery: errors, the format registry, manifests, the dataset reference, the world, results, caches."""
