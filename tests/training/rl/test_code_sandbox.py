"""The sandboxed code reward: bad completions are stopped and scored 0 with the reason."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from kiln.training.rl.rewards import RewardSet
from kiln.training.rl.rewards.code_reward import extract_code
from tests.training.rl import user_rewards

pytestmark = pytest.mark.slow  # each case starts a Python subprocess

ROW = {"tests": "assert add(2, 3) == 5\nassert add(-1, 1) == 0"}
GOOD = "Here is my solution:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
# a wall timeout well above the CPU limit: a busy machine must not turn one into the other
LIMITS = {"timeout_s": 20, "cpu_s": 1, "memory_mb": 256}


def code_reward(**params):
    return RewardSet.from_specs([{"name": "code", "params": {**LIMITS, **params}}])


def score(completion: str, row: dict = ROW, **params):
    return code_reward(**params).score_one("p", completion, row)


def test_a_correct_solution_scores_one():
    result = score(GOOD)
    assert result.total == 1.0 and result.failures == {}


def test_ordinary_code_runs_numpy_and_files_in_its_folder_included():
    code = (
        "import collections, functools, heapq, json, os, tempfile\n"
        "import numpy as np\n"
        "os.makedirs('data/out')\n"
        "open('data/out/a.txt', 'w').write(json.dumps([1, 2]))\n"
        "with tempfile.NamedTemporaryFile('w') as t:\n    t.write('scratch')\n"
        "def add(a, b):\n    return int(np.add(a, b))\n"
    )
    result = score(code)
    assert result.total == 1.0, result.failures


def test_code_is_the_last_python_block_or_the_raw_completion():
    assert extract_code("```\nx = 1\n```\n```python\ny = 2\n```") == "y = 2\n"
    assert extract_code("```js\nno\n```") == "no\n"
    assert extract_code("def f(): pass") == "def f(): pass"


@pytest.mark.parametrize(
    "code, reason",
    [
        ("def add(a, b):\n    while True:\n        pass", "CPU time limit exceeded"),
        ("x = []\nwhile True:\n    x.append(bytearray(10**7))", "memory limit exceeded"),
        (
            "import socket\nsocket.create_connection(('127.0.0.1', 9))",
            "network access refused (import _socket)",
        ),
        ("import os\nwhile True:\n    os.fork()", "process creation refused (os.fork)"),
        ("import os\nos.system('echo hi')", "process creation refused (os.system)"),
        ("import subprocess", "process creation refused (import _posixsubprocess)"),
        ("import ctypes\nctypes.CDLL(None).getpid()", "native code refused (ctypes.dlsym)"),
        ("import ctypes\nctypes.CDLL('libc.so.6')", "native code refused (ctypes.dlopen)"),
        (
            "def add(a, b):\n    return a - b",
            "test 0 failed: assert add(2, 3) == 5 (AssertionError)",
        ),
        ("def add(a, b) return", "the code does not compile: expected ':' (line 1)"),
        ("raise SystemExit(0)", "the code raised SystemExit: 0"),
    ],
)
def test_a_bad_completion_is_stopped_and_scored_zero_with_the_reason(code, reason):
    result = score(f"```python\n{code}\n```")
    assert result.total == 0.0
    assert result.failures["code"].startswith(reason), result.failures


def test_a_completion_that_waits_is_killed_at_the_wall_timeout():
    result = score("import time\ntime.sleep(60)", timeout_s=1)
    assert result.total == 0.0 and result.failures["code"] == "timed out after 1 s"


def test_writes_outside_the_folder_are_refused_and_inside_allowed(tmp_path):
    outside = tmp_path / f"escape-{uuid.uuid4().hex}"
    code = (
        "open('scratch.txt', 'w').write('ok')\n"
        "def add(a, b):\n    return a + b\n"
        f"open({str(outside)!r}, 'w').write('escaped')\n"
    )
    result = score(code)
    assert result.total == 0.0
    assert result.failures["code"] == f"write outside the sandbox folder refused ({outside})"
    assert not outside.exists()
    removal = score(f"import os\nos.remove({str(tmp_path)!r})")
    assert removal.failures["code"].startswith("change outside the sandbox folder refused")
    assert tmp_path.exists()


def test_a_refusal_counts_even_when_the_code_catches_it():
    code = (
        "try:\n    import socket\nexcept BaseException:\n    pass\ndef add(a, b):\n    return a + b"
    )
    result = score(code)
    assert result.total == 0.0 and result.failures["code"].startswith("network access refused")


def test_partial_credit_is_the_fraction_of_tests_passed():
    row = {"tests": ["assert add(1, 1) == 2", "assert add(2, 2) == 5", "assert add(0, 0) == 0"]}
    wrong_once = "def add(a, b):\n    return a + b"
    result = score(wrong_once, row, partial=True)
    assert result.total == pytest.approx(2 / 3)
    assert result.failures["code"] == "test 1 failed: assert add(2, 2) == 5 (AssertionError)"
    assert score(wrong_once, row).total == 0.0


def test_output_is_capped_and_the_result_still_arrives():
    result = score("print('x' * 10**6)\ndef add(a, b):\n    return a + b", output_chars=100)
    assert result.total == 1.0


def test_many_in_parallel_finish_with_their_own_scores():
    rewards = code_reward()
    bad = "```python\nimport os\nos.fork()\n```"
    hog = "```python\nx = []\nwhile True:\n    x.append(bytearray(10**7))\n```"
    completions = [GOOD, bad, hog, GOOD] * 2
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda c: rewards.score_one("p", c, ROW), completions))
    assert [r.total for r in results] == [1.0, 0.0, 0.0, 1.0] * 2
    user_rewards.CALLER_THREADS.clear()
    mixed = RewardSet.from_specs(
        [
            {"name": "code", "params": LIMITS},
            {"function": "tests.training.rl.user_rewards:record_thread"},
        ]
    )
    batched = mixed.score(["p"] * 4, completions[:4], [ROW] * 4, max_workers=4)
    assert [r.total for r in batched] == [1.0, 0.0, 0.0, 1.0]
    # the sandboxes ran on the pool; the user function stayed in the caller's thread
    assert len(user_rewards.CALLER_THREADS) == 4
    assert set(user_rewards.CALLER_THREADS) == {threading.get_ident()}
