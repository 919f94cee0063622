"""Deduplication: exact (hash of normalised text), fuzzy (MinHash + LSH + connected components)."""
