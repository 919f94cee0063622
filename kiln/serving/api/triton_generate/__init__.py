"""Triton's generate extension (`/v2/models/{m}/generate[_stream]`)."""
