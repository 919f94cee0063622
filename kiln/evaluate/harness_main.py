"""The lm-evaluation-harness side of `kiln eval`, run in a child process:

    python -m kiln.evaluate.harness_main REQUEST.json

REQUEST.json holds `simple_evaluate`'s arguments (model, model_args, tasks, include_path, limit,
num_fewshot, apply_chat_template) and `output`, the JSON file the results go to. A child process
keeps lm-eval's logging, progress bars and memory out of the stage, and its output in a log file.
"""

from __future__ import annotations

import json
import os
import sys


def main(request_path: str) -> int:
    import logging
    from importlib.metadata import version

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    import lm_eval
    from lm_eval.tasks import TaskManager

    with open(request_path, encoding="utf-8") as f:
        req = json.load(f)
    tasks = TaskManager(include_path=req["include_path"], include_defaults=False)
    results = lm_eval.simple_evaluate(
        model=req["model"],
        model_args=req["model_args"],
        tasks=req["tasks"],
        task_manager=tasks,
        num_fewshot=req.get("num_fewshot"),
        limit=req.get("limit"),
        apply_chat_template=req.get("apply_chat_template", False),
        log_samples=True,
        bootstrap_iters=req.get("bootstrap_iters", 100),
    )
    if results is None:  # only rank 0 of a multi-process run returns results
        raise SystemExit("lm-eval returned no results")
    out = {
        "lm_eval_version": version("lm_eval"),
        "results": results["results"],
        "n_samples": results.get("n-samples", {}),
        "versions": results.get("versions", {}),
    }
    samples = results.get("samples", {})
    with open(req["output"], "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2, ensure_ascii=False, default=str)
    with open(req["samples_output"], "w", encoding="utf-8") as f:
        for task, rows in samples.items():
            for row in rows:
                f.write(json.dumps({"task": task, **row}, ensure_ascii=False, default=str) + "\n")
    print(f"kiln: lm-eval results written to {req['output']}", flush=True)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    # the results are on disk: skip tearing down lm-eval's, datasets' and torch's modules and
    # threads (seconds under load)
    os._exit(code)
