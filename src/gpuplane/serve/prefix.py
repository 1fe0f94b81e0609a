"""A bounded index of which instances recently served which prompt prefixes.

Pure. A prompt is cut into fixed-size character blocks and each block is hashed together with
the hash of everything before it, so equal hashes mean equal prefixes. The index maps a block
hash to the instances that served it most recently, and evicts least-recently-used blocks past
its bound. `match` answers, per instance, how many leading blocks of a prompt it holds, and
`is_hit` whether that many make a cache hit worth placing (or waiting) for.

What each engine's cache actually keeps is learned from its answers, since the gateway is
rarely told (an external llama.cpp keeps only its last prompt unless started with `--cache`):
a prefix placed as cached is measured by its reuse distance, the blocks the instance served
since it last served that prefix (`reuse_distance`). An answer at uncached speed says the engine
keeps fewer blocks than that: the instance's cache model is bounded to it and drops what it
used less recently (`evicted`). An answer at
cached speed for a prompt the model had dropped says it keeps more: the bound grows by that
prompt (`held`). So the index stops predicting hits an instance does not deliver.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

MAX_BLOCKS_PER_PROMPT = 1024  # prefixes longer than this many blocks are compared up to here
# How many of an instance's most recently used blocks a reuse distance is looked for in.
MAX_REUSE_SCAN = 1024
# A prefix worth placing for (and waiting for) covers at least this share of the prompt's blocks.
LOCALITY_MIN_SHARE = 0.5


def prompt_text(body: Mapping[str, Any]) -> str:
    """The text a request's prefix is made of: chat messages in order, or the completion prompt.
    `body` is parsed JSON: its objects are dicts."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, list):  # content parts: keep the text ones
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(f"{message.get('role', '')}\x1f{content or ''}\x1e")
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return "\x1e".join(str(p) for p in prompt)
    return str(prompt or "")


def block_hashes(text: str, block_chars: int) -> list[int]:
    """Chained hashes of the prompt's complete blocks (a partial last block is left out)."""
    out: list[int] = []
    h = 0
    end = min(len(text) - len(text) % block_chars, block_chars * MAX_BLOCKS_PER_PROMPT)
    for start in range(0, end, block_chars):
        h = hash((h, text[start : start + block_chars]))
        out.append(h)
    return out


def is_hit(matched: int, blocks: Sequence[int]) -> bool:
    """Do `matched` leading blocks of a prompt's `blocks` make a cache hit worth placing for?"""
    return bool(blocks) and matched >= LOCALITY_MIN_SHARE * len(blocks)


class _CacheModel(ABC):
    """The index's model of one engine's prefix cache, which evicts oldest first; `capacity`
    in blocks (None: unbounded)."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity

    @abstractmethod
    def add(self, hashes: Sequence[int]) -> list[int]:
        """Hold these blocks; return the blocks evicted to make room."""

    @abstractmethod
    def discard(self, h: int) -> None: ...

    @abstractmethod
    def blocks(self) -> list[int]: ...

    @abstractmethod
    def __contains__(self, h: int) -> bool: ...

    @abstractmethod
    def __len__(self) -> int:
        """Entries held (blocks, or saved requests)."""

    def _size(self) -> int:
        """Blocks held, as `capacity` counts them: one per entry unless an entry holds more."""
        return len(self)

    @abstractmethod
    def _pop_oldest(self) -> list[int]:
        """Drop the least recently used entry; return the blocks no longer held."""

    def _evict_to_capacity(self) -> list[int]:
        """Drop the oldest entries past `capacity`; the newest stays unless it is 0 (an engine
        that keeps one prompt keeps its last one, whatever its size)."""
        evicted: list[int] = []
        keep = 1 if self.capacity else 0
        while self.capacity is not None and len(self) > keep and self._size() > self.capacity:
            evicted += self._pop_oldest()
        return evicted

    @abstractmethod
    def newer_than(self, hashes: Sequence[int]) -> int | None:
        """Blocks used since the prefix `hashes` (leading blocks held here) was last used; None
        when it is not held."""

    def bound(self, blocks: int) -> list[int]:
        """The engine keeps at most `blocks`: shrink to it; return the blocks no longer held."""
        if self.capacity is None or blocks < self.capacity:
            self.capacity = blocks
        return self._evict_to_capacity()

    def grow(self, blocks: int) -> None:
        """The engine kept `blocks` more than the bound allowed (unbounded: nothing to do)."""
        if self.capacity is not None:
            self.capacity += blocks

    def evict_through(self, hashes: Sequence[int]) -> list[int]:
        """The engine evicted these blocks, and so everything it used less recently: drop all
        of it and return the blocks no longer held."""
        pending = {h for h in hashes if h in self}
        evicted: list[int] = []
        while pending and len(self):
            gone = self._pop_oldest()
            evicted += gone
            pending.difference_update(gone)
        return evicted


class _BlockLRU(_CacheModel):
    """An engine cache that keeps blocks (vLLM, SGLang): least recently used blocks go first."""

    def __init__(self, capacity: int | None) -> None:
        super().__init__(capacity)
        self._held: OrderedDict[int, None] = OrderedDict()

    def add(self, hashes: Sequence[int]) -> list[int]:
        held = self._held
        for h in hashes:
            held[h] = None
            held.move_to_end(h)
        return self._evict_to_capacity()

    def __contains__(self, h: int) -> bool:
        return h in self._held

    def __len__(self) -> int:
        return len(self._held)

    def _pop_oldest(self) -> list[int]:
        return [self._held.popitem(last=False)[0]]

    def discard(self, h: int) -> None:
        self._held.pop(h, None)

    def blocks(self) -> list[int]:
        return list(self._held)

    def newer_than(self, hashes: Sequence[int]) -> int | None:
        # the prefix's last block is the one of its blocks other prompts share least: the
        # blocks after it in LRU order were used since. The scan stops there, or after
        # `MAX_REUSE_SCAN` blocks: a prefix used longer ago than that counts as not measured.
        last = hashes[-1] if hashes else None
        if last not in self._held:
            return None
        for n, h in enumerate(itertools.islice(reversed(self._held), MAX_REUSE_SCAN)):
            if h == last:
                return n
        return None


class _RequestLRU(_CacheModel):
    """An engine cache that keeps one saved state per request (llama.cpp's RAM prompt cache):
    a lookup touches the entry sharing the longest prefix, every request adds an entry, and the
    oldest entries go when their total size passes the capacity."""

    def __init__(self, capacity: int | None) -> None:
        super().__init__(capacity)
        self._entries: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self._refs: dict[int, int] = {}
        self._blocks = 0
        self._ids = itertools.count()

    def add(self, hashes: Sequence[int]) -> list[int]:
        best, best_len = None, 0
        for eid, entry in self._entries.items():
            n = _common_prefix(entry, hashes)
            if n > best_len:
                best, best_len = eid, n
        if best is not None:
            self._entries.move_to_end(best)
        self._entries[next(self._ids)] = tuple(hashes)
        self._blocks += len(hashes)
        for h in hashes:
            self._refs[h] = self._refs.get(h, 0) + 1
        return self._evict_to_capacity()

    def __contains__(self, h: int) -> bool:
        return h in self._refs

    def __len__(self) -> int:
        return len(self._entries)

    def _size(self) -> int:
        return self._blocks

    def _pop_oldest(self) -> list[int]:
        _, old = self._entries.popitem(last=False)
        self._blocks -= len(old)
        evicted = []
        for h in old:
            left = self._refs.get(h, 0) - 1
            if left > 0:
                self._refs[h] = left
            elif self._refs.pop(h, None) is not None:
                evicted.append(h)
        return evicted

    def discard(self, h: int) -> None:
        self._refs.pop(h, None)

    def blocks(self) -> list[int]:
        return list(self._refs)

    def newer_than(self, hashes: Sequence[int]) -> int | None:
        n, last = 0, len(hashes) - 1
        for entry in reversed(self._entries.values()):
            if last >= 0 and len(entry) > last and entry[last] == hashes[last]:
                return n
            n += len(entry)
        return None


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class PrefixIndex:
    """Block hash → most recent holder instances, LRU-bounded overall and, optionally, per
    instance by a model of its engine's cache (what the engine evicts, the index forgets)."""

    def __init__(
        self,
        max_blocks: int,
        instances_per_block: int = 4,
        blocks_per_instance: int | None = None,
        per_request_cache: bool = False,
    ) -> None:
        self.max_blocks = max_blocks
        self.instances_per_block = instances_per_block
        self._blocks: OrderedDict[int, list[str]] = OrderedDict()
        self._cache_kind: type[_CacheModel] = _RequestLRU if per_request_cache else _BlockLRU
        self._blocks_per_instance = blocks_per_instance
        self._held: dict[str, _CacheModel] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Per instance, the number of leading blocks of `hashes` it recently served; ordered by
        depth, then by how recently the instance served its deepest block (first = best)."""
        depth: dict[str, int] = {}
        recency: dict[str, int] = {}
        alive: list[str] | None = None
        for n, h in enumerate(hashes, start=1):
            holders = self._blocks.get(h)
            if not holders:
                break
            alive = list(holders) if alive is None else [i for i in holders if i in alive]
            if not alive:
                break
            for rank, iid in enumerate(alive):
                depth[iid] = n
                recency[iid] = rank
        return dict(sorted(depth.items(), key=lambda kv: (-kv[1], recency[kv[0]])))

    def depth_on(self, hashes: Sequence[int], instance_id: str) -> int:
        """How many leading blocks of `hashes` `instance_id` recently served (`match` for one
        instance, without ranking the others)."""
        blocks = self._blocks
        n = 0
        for h in hashes:
            holders = blocks.get(h)
            if holders is None or instance_id not in holders:
                break
            n += 1
        return n

    def record(self, hashes: Sequence[int], instance_id: str) -> None:
        """`instance_id` now holds this prefix: it becomes the most recent holder of each block."""
        blocks = self._blocks
        held = self._held.get(instance_id)
        if held is None:
            held = self._held[instance_id] = self._cache_kind(self._blocks_per_instance)
        for h in hashes:
            holders = blocks.get(h)
            if holders is None:
                blocks[h] = [instance_id]
            else:
                blocks.move_to_end(h)
                if holders[0] != instance_id:
                    if instance_id in holders:
                        holders.remove(instance_id)
                    holders.insert(0, instance_id)
                    for dropped in holders[self.instances_per_block :]:
                        self._held[dropped].discard(h)
                    del holders[self.instances_per_block :]
        for h in held.add(hashes):
            self._drop(h, instance_id)
        while len(blocks) > self.max_blocks:
            h, holders = blocks.popitem(last=False)
            for iid in holders:
                self._held[iid].discard(h)

    def reuse_distance(self, hashes: Sequence[int], instance_id: str) -> int | None:
        """Blocks `instance_id` served since it last served the prefix `hashes` (its matched
        leading blocks); None when the index does not hold it there. Ask before `record`."""
        held = self._held.get(instance_id)
        return held.newer_than(hashes) if held is not None and hashes else None

    def evicted(self, instance_id: str, distance: int) -> None:
        """The engine no longer held a prefix it had served `distance` blocks before: it keeps
        fewer blocks than that. The instance's cache model is bounded to `distance` (what it
        served since, the prompt just placed there among it, stays held)."""
        held = self._held.get(instance_id)
        if held is not None:
            for h in held.bound(distance):
                self._drop(h, instance_id)

    def held(self, prompt: Sequence[int], instance_id: str) -> None:
        """The engine held `prompt` when the index thought it did not: it keeps more than the
        instance's cache model allows; the bound grows by that prompt."""
        held = self._held.get(instance_id)
        if held is not None:
            held.grow(len(prompt))

    def capacity(self, instance_id: str) -> int | None:
        """The blocks the index lets `instance_id` hold (None: unbounded), as learned."""
        held = self._held.get(instance_id)
        return held.capacity if held is not None else self._blocks_per_instance

    def forget_prefix(self, hashes: Sequence[int], instance_id: str) -> None:
        """`instance_id` no longer holds these blocks: its engine evicted them, and with them
        what it had used less recently."""
        held = self._held.get(instance_id)
        evicted = held.evict_through(hashes) if held is not None else []
        for h in (*hashes, *evicted):
            self._drop(h, instance_id)

    def forget(self, instance_id: str) -> None:
        """Drop an instance everywhere (it restarted: its cache is empty)."""
        held = self._held.pop(instance_id, None)
        for h in held.blocks() if held else []:
            self._drop(h, instance_id)

    def _drop(self, h: int, instance_id: str) -> None:
        holders = self._blocks.get(h)
        if holders and instance_id in holders:
            holders.remove(instance_id)
            if not holders:
                del self._blocks[h]
