"""Triton Inference Server: the model.py its Python backend runs, and a local server."""
