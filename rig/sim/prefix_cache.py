"""A prefix cache over token ids, standing in for SGLang's radix cache: how many leading prompt tokens are cached.

Each cached sequence is stored as the set of hashes of all its prefixes, so a lookup walks the prompt once and
stops at the first prefix never seen. Sequences are evicted least-recently-used when the token budget is full.
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixCache:
    def __init__(self, capacity_tokens: int):
        self.capacity = max(0, capacity_tokens)
        self._refs: dict[int, int] = {}  # prefix hash -> number of stored sequences containing it
        self._seqs: OrderedDict[int, tuple[int, ...]] = OrderedDict()  # seq hash -> its prefix hashes
        self.tokens = 0

    @staticmethod
    def _prefix_hashes(ids: list[int]) -> list[int]:
        out, h = [], 0
        for t in ids:
            h = hash((h, t))
            out.append(h)
        return out

    def match(self, ids: list[int]) -> int:
        """Length of the longest cached prefix of ids."""
        n, h = 0, 0
        refs = self._refs
        for t in ids:
            h = hash((h, t))
            if h not in refs:
                break
            n += 1
        return n

    def insert(self, ids: list[int]) -> None:
        """Cache a sequence (a finished request's prompt plus output)."""
        if not ids or self.capacity == 0:
            return
        hashes = self._prefix_hashes(ids)
        key = hashes[-1]
        if key in self._seqs:
            self._seqs.move_to_end(key)
            return
        self._seqs[key] = tuple(hashes)
        for h in hashes:
            self._refs[h] = self._refs.get(h, 0) + 1
        self.tokens += len(hashes)
        while self.tokens > self.capacity and len(self._seqs) > 1:
            self._evict()

    def _evict(self) -> None:
        _, hashes = self._seqs.popitem(last=False)
        for h in hashes:
            c = self._refs[h] - 1
            if c:
                self._refs[h] = c
            else:
                del self._refs[h]
        self.tokens -= len(hashes)

    def clear(self) -> None:
        self._refs.clear()
        self._seqs.clear()
        self.tokens = 0
