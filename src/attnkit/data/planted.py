"""Planted long-range recall: keys written into real text at known places, so that remembering shows.

B rows (streams), N tokens per row, K pairs, Q key length in tokens, D distance.

A pair is a marker followed by a random key of Q tokens at position a, and D tokens later the same marker and the
same key again:

    position  a        a+1 .. a+Q        ...text...   a+D      a+D+1 .. a+D+Q
              marker   key (random)                   marker   the key again: the recalled tokens

The first key is random, so nothing predicts it; the recalled key tokens are predictable only by a model that still
holds the first key D tokens later. attnkit.eval.recall scores exactly those tokens, by D (a few rare words or
letters: chance is log(pool size) nats a token, perfect recall 0), and nothing else.

The marker is one token id; its natural occurrences are overwritten by a filler token first, so it appears only
where it was planted (two per pair). Pairs never overlap: a row holds pair after pair, each after a gap of natural
text, until the next one no longer fits. A stream is cut into B rows as `attnkit.data.lm.LMStreams` cuts it (the
first N * B tokens, row b = tokens b*N .. b*N + N - 1), and planted row by row, so no pair crosses from one row to
the next: the planted rows, flattened, are read back as the same rows by LMStreams with batch size B.

Pure numpy and seeded: the same stream, arguments and seed give the same planting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attnkit.errors import DataError


@dataclass(frozen=True)
class Planted:
    """Rows with pairs planted, and where: pair k is in row `row[k]`, its first marker at `marker_at[k]`, its second
    at marker_at[k] + distance[k], each followed by keys[k]."""

    ids: np.ndarray  # (B, N) int64
    row: np.ndarray  # (K,)
    marker_at: np.ndarray  # (K,)
    distance: np.ndarray  # (K,)
    keys: np.ndarray  # (K, Q)
    marker: int

    @property
    def key_len(self) -> int:
        return self.keys.shape[1]

    def recalled(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(row, col, token, distance) of every recalled key token, (K * Q,) each, pair by pair: the tokens at
        marker_at + D + 1 .. marker_at + D + Q, equal to the first key's."""
        q = self.key_len
        cols = (self.marker_at + self.distance)[:, None] + 1 + np.arange(q)  # (K, Q)
        return (np.repeat(self.row, q), cols.reshape(-1), self.keys.reshape(-1), np.repeat(self.distance, q))

    def flat(self) -> np.ndarray:
        """The rows one after the other (B * N,): what LMStreams reads back as these rows with batch size B."""
        return self.ids.reshape(-1)


def cut_rows(ids: np.ndarray, rows: int) -> np.ndarray:
    """(N,) -> (B, N // B): the first N // B * B tokens, row b the b-th contiguous part (as LMStreams cuts them)."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    per_row = ids.size // rows
    if rows < 1 or per_row < 2:
        raise DataError(f"{ids.size} tokens are too few for {rows} rows")
    return ids[: per_row * rows].reshape(rows, per_row).copy()


def plant(ids: np.ndarray, *, marker: int, filler: int, key_pool: Sequence[int], key_len: int,
          distances: Sequence[int], rows: int = 1, order: str = "cycle", gap: tuple[int, int] = (16, 64),
          lead: int = 0, seed: int = 0) -> Planted:
    """Plant pairs (marker + key, and D tokens later the same again) into the stream ids (N,) cut into `rows` rows.

    Pair k takes D = distances[k % len] with order "cycle" (every distance equally often: evaluation), or a
    uniform draw from distances with order "random" (training). Keys are drawn uniformly from `key_pool` (with
    replacement); the gap of natural text before each pair uniformly from `gap` (both ends included). The first
    pair of a row starts after `lead` + a gap (room for a reader's window before the first recalled key)."""
    pool = np.asarray(sorted(set(int(k) for k in key_pool)), dtype=np.int64)
    distances = [int(d) for d in distances]
    if order not in ("cycle", "random"):
        raise ValueError(f"order is cycle or random, not {order!r}")
    if key_len < 1 or pool.size < 1 or marker in pool or filler == marker:
        raise ValueError("plant needs key_len >= 1 and a key pool without the marker (and a filler that is not it)")
    if not distances or min(distances) <= key_len:
        raise ValueError(f"every distance must exceed the key length {key_len} (the second marker comes after the "
                         f"first key), not {distances}")
    if gap[0] < 0 or gap[1] < gap[0] or lead < 0:
        raise ValueError(f"gap is (shortest, longest) >= 0 and lead >= 0, not {gap} and {lead}")
    out = cut_rows(ids, rows)
    out[out == marker] = filler
    rng = np.random.default_rng(seed)
    placed: list[tuple[int, int, int, np.ndarray]] = []
    for b in range(out.shape[0]):
        at = lead + int(rng.integers(gap[0], gap[1] + 1))
        while True:
            d = distances[len(placed) % len(distances)] if order == "cycle" else int(rng.choice(distances))
            if at + d + key_len >= out.shape[1]:
                break
            key = rng.choice(pool, size=key_len)
            for start in (at, at + d):
                out[b, start] = marker
                out[b, start + 1 : start + 1 + key_len] = key
            placed.append((b, at, d, key))
            at += d + key_len + 1 + int(rng.integers(gap[0], gap[1] + 1))
    if not placed:
        raise DataError(f"no pair fits in rows of {out.shape[1]} tokens (distances up to {max(distances)})")
    row, marker_at, distance, keys = zip(*placed)
    return Planted(out, np.asarray(row), np.asarray(marker_at), np.asarray(distance), np.stack(keys), int(marker))
