"""Deduplication: exact (hash of normalised text) and fuzzy (MinHash + LSH + connected components)."""
