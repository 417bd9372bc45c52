"""argparse types of the commands' numeric options: each turns a bad value into one line."""

from __future__ import annotations

import argparse

from .threads import max_threads, too_many_threads

__all__ = ["non_negative_int", "positive_int", "thread_count"]


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0 is not positive")
    return value


def thread_count(text: str) -> int:
    value = positive_int(text)
    if value > max_threads():
        raise argparse.ArgumentTypeError(f"{value}: {too_many_threads()}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value
