"""vLLM's `vllm:lora_requests_info` on `/metrics`: which LoRA adapters running and waiting
requests use, and the most one forward holds, as labels of a gauge whose value is the scrape
time (vLLM's form; dashboards made for it read these labels)."""

from __future__ import annotations

import time

from prometheus_client.core import GaugeMetricFamily

from kiln.serving.backends.backend import Backend

LABELS = ["max_lora", "waiting_lora_adapters", "running_lora_adapters"]


class LoRAInfoCollector:
    def __init__(self, lora_requests) -> None:
        self.lora_requests = lora_requests  # () -> {"max_lora", "running", "waiting"} | None

    def collect(self):
        info = self.lora_requests()
        if info is None:  # LoRA serving off
            return
        family = GaugeMetricFamily(
            "vllm:lora_requests_info", "Running stats on LoRA requests.", labels=LABELS
        )
        labels = [str(info["max_lora"]), ",".join(info["waiting"]), ",".join(info["running"])]
        family.add_metric(labels, time.time())
        yield family


def lora_requests(backend: Backend):
    """The backend's `lora_requests()`, where it has one."""
    method = getattr(backend, "lora_requests", None)
    return method if callable(method) else None
