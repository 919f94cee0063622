"""bench/rl.py's side of the TRL peer: TRL's GRPOTrainer (bench/trl_peer.py) in its own venv,
stepped in lockstep with a Kiln GRPO loop and scored by that loop's own RewardSet, so the two
train on the same model, prompt file, group size, lengths, threads and reward, one step each in
turn (the side that goes first alternates), and load from other jobs falls on both alike."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time

TRL_VENV = os.environ.get("KILN_TRLVENV", "/tmp/trlvenv")
PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trl_peer.py")
MAKE_VENV = (
    "python3.11 -m venv {venv} && {venv}/bin/pip install torch==2.13.0 "
    "&& {venv}/bin/pip install torch==2.13.0 trl==1.16.0"
)


def venv_python(venv: str) -> str | None:
    python = os.path.join(venv, "bin", "python")
    return python if os.path.exists(python) else None


class TRLPeer:
    """A running `trl_peer.py grpo`, set up and waiting; `step()` lets it take one optimizer
    step and returns that step's figures, answering its reward requests with `rewards` (a Kiln
    RewardSet). A step's `wall_s` runs from `go` to the peer's next `ready` (or its end): all
    of TRL's loop, its logging and batch fetch included, on the parent's clock; `cpu_s` is the
    peer process's CPU time from `go` to that `ready`, `idle_cpu_s` what it spent waiting for
    the `go` (while the other side stepped: it should be about 0)."""

    def __init__(self, venv: str, model_dir: str, prompts: str, rewards, args) -> None:
        self.rewards = rewards
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - TRL's stderr, closed in close()
        self.proc = subprocess.Popen(
            [venv_python(venv), PEER, "grpo", model_dir, prompts, "--steps", str(args.steps),
             "--group-size", str(args.group_size), "--prompts-per-step",
             str(args.prompts_per_step), "--max-new-tokens", str(args.max_new_tokens),
             "--lr", str(args.lr), "--threads", str(args.threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1,
        )  # fmt: skip
        self._expect("ready")  # imports, model and trainer set up: none of it timed

    def _hear(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith("KILN "):
                return json.loads(line[len("KILN ") :])
        self.proc.wait()
        self.log.seek(0)
        raise RuntimeError(f"TRL peer exited {self.proc.returncode}:\n{self.log.read()[-3000:]}")

    def _expect(self, *keys: str) -> dict:
        message = self._hear()
        if not any(k in message for k in keys):
            raise RuntimeError(f"TRL peer: expected {' or '.join(keys)}, got {message}")
        return message

    def _say(self, text: str) -> None:
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def step(self) -> dict:
        started = time.perf_counter()
        self._say("go")
        while "step" not in (message := self._hear()):
            items = message["reward"]
            results = self.rewards.score([x["prompt"] for x in items],
                                         [x["completion"] for x in items],
                                         [x["row"] for x in items])  # fmt: skip
            self._say(json.dumps([r.total for r in results]))
        turn = self._expect("ready", "done")
        return {**message["step"], "wall_s": time.perf_counter() - started,
                "cpu_s": turn["cpu_s"], "idle_cpu_s": turn["idle_cpu_s"]}  # fmt: skip

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def lockstep(kiln_loop, peer: TRLPeer, steps: int) -> tuple[list[dict], list[dict]]:
    """Kiln's and TRL's steps alternating, the side that goes first alternating too; each
    side's per-step figures (`wall_s` on this process's clock for both, `cpu_s` each side's
    process CPU time: on a shared machine, where other jobs stretch wall time, the steadier)."""
    ours, theirs = [], []
    try:
        for step in range(steps):
            for side in ("kiln", "trl") if step % 2 == 0 else ("trl", "kiln"):
                started, cpu = time.perf_counter(), time.process_time()
                if side == "kiln":
                    m = kiln_loop.step(step)
                    # this process's CPU time: the trainer's thread and the engine's together
                    m = {**m, "wall_s": time.perf_counter() - started,
                         "cpu_s": time.process_time() - cpu}  # fmt: skip
                    ours.append(m)
                else:
                    m = peer.step()
                    theirs.append(m)
                print(f"{side:4} step {step + 1}: {m['wall_s']:.2f} s, reward {m['reward']:.3f}")
    finally:
        kiln_loop.close()
        peer.close()
    return ours, theirs
