"""The KServe v2 / Open Inference Protocol API."""
