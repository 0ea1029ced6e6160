"""Process-wide settings made by attnkit.runtime."""

from __future__ import annotations

import ctypes
import sys

import pytest

from attnkit.runtime import keep_freed_memory

glibc = sys.platform == "linux" and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


@pytest.mark.skipif(not glibc, reason="mallopt is glibc's")
def test_keep_freed_memory_sets_glibc_and_can_be_turned_off(monkeypatch):
    monkeypatch.delenv("ATTNKIT_SYSTEM_MALLOC", raising=False)
    assert keep_freed_memory.__wrapped__() is True
    monkeypatch.setenv("ATTNKIT_SYSTEM_MALLOC", "1")
    assert keep_freed_memory.__wrapped__() is False
