"""The simulated engine's prefix caches, keyed by chained block hashes: vLLM's and SGLang's LRU
of blocks (`PrefixCache`), and llama.cpp's last prompts' states (`PromptCache`). Pure: the
instance model (`model.py`) asks them what a prompt hits and tells them what it prefilled."""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol


def block_hashes(text: str, block_chars: int) -> list[int]:
    """Chained hashes of the whole leading blocks of `text` (a partial last block is not cached)."""
    out: list[int] = []
    h = 0
    for start in range(0, len(text) - block_chars + 1, block_chars):
        h = hash((h, text[start : start + block_chars]))
        out.append(h)
    return out


class Cache(Protocol):
    """An instance's prefix cache: `match` a prompt's block hashes (and touch what hit),
    `insert` a prefilled prompt's, `clear`; `len`: what it holds (blocks, or prompts)."""

    def __len__(self) -> int: ...
    def match(self, hashes: list[int]) -> int: ...
    def insert(self, hashes: list[int]) -> None: ...
    def clear(self) -> None: ...


class PrefixCache:
    """An LRU set of block hashes bounded to `capacity_blocks` blocks (vLLM, SGLang)."""

    __slots__ = ("_blocks", "capacity_blocks")

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, hashes: list[int]) -> int:
        """How many leading blocks are cached; those become most recently used."""
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            n += 1
        return n

    def insert(self, hashes: list[int]) -> None:
        if self.capacity_blocks == 0:
            return
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()


class PromptCache:
    """The states of the last `capacity_prompts` prompts, least recently used first out
    (llama.cpp's server: its current context only by default, more with `--cache`). A prompt
    hits on the longest leading run of blocks it shares with one kept prompt."""

    __slots__ = ("_prompts", "capacity_prompts")

    def __init__(self, capacity_prompts: int) -> None:
        self.capacity_prompts = capacity_prompts
        self._prompts: OrderedDict[tuple[int, ...], None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._prompts)

    def match(self, hashes: list[int]) -> int:
        """Blocks the best kept prompt shares with `hashes`; that prompt is touched."""
        best, best_n = None, 0
        for kept in self._prompts:
            n = 0
            for a, b in zip(kept, hashes, strict=False):
                if a != b:
                    break
                n += 1
            if n > best_n:
                best, best_n = kept, n
        if best is not None:
            self._prompts.move_to_end(best)
        return best_n

    def insert(self, hashes: list[int]) -> None:
        if self.capacity_prompts == 0:
            return
        key = tuple(hashes)
        self._prompts[key] = None
        self._prompts.move_to_end(key)
        while len(self._prompts) > self.capacity_prompts:
            self._prompts.popitem(last=False)

    def clear(self) -> None:
        self._prompts.clear()
