"""User rewards imported by `function: module:function` in the tests."""

import threading


def brevity(prompt: str, completion: str, row: dict, limit: int = 10) -> float:
    return 1.0 if len(completion) <= limit else 0.0


def broken(prompt: str, completion: str, row: dict) -> float:
    raise RuntimeError("the reward has a bug\non two lines")


NOT_A_FUNCTION = 3


CALLER_THREADS: list[int] = []


def record_thread(prompt: str, completion: str, row: dict) -> float:
    CALLER_THREADS.append(threading.get_ident())
    return 0.0
