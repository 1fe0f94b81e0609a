"""A bounded index of which instances recently served which prompt prefixes.

Pure. A prompt is cut into fixed-size character blocks and each block is hashed together with
the hash of everything before it, so equal hashes mean equal prefixes. The index maps a block
hash to the instances that served it most recently, and evicts least-recently-used blocks past
its bound. `match` answers, per instance, how many leading blocks of a prompt it holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

MAX_BLOCKS_PER_PROMPT = 1024  # prefixes longer than this many blocks are compared up to here


def prompt_text(body: Mapping[str, Any]) -> str:
    """The text a request's prefix is made of: chat messages in order, or the completion prompt."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for message in messages:
            if not isinstance(message, Mapping):
                continue
            content = message.get("content")
            if isinstance(content, list):  # content parts: keep the text ones
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
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


class PrefixIndex:
    """Block hash → most recent holder instances, LRU-bounded overall and, optionally, per
    instance (an engine's prefix cache holds only so much: the index forgets what it evicts)."""

    def __init__(
        self,
        max_blocks: int,
        instances_per_block: int = 4,
        blocks_per_instance: int | None = None,
    ) -> None:
        self.max_blocks = max_blocks
        self.instances_per_block = instances_per_block
        self.blocks_per_instance = blocks_per_instance
        self._blocks: OrderedDict[int, list[str]] = OrderedDict()
        self._held: dict[str, OrderedDict[int, None]] = {}  # per instance, LRU order

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Per instance, the number of leading blocks of `hashes` it recently served."""
        depth: dict[str, int] = {}
        alive: set[str] | None = None
        for n, h in enumerate(hashes, start=1):
            holders = self._blocks.get(h)
            if not holders:
                break
            alive = set(holders) if alive is None else alive.intersection(holders)
            if not alive:
                break
            for iid in alive:
                depth[iid] = n
        return depth

    def record(self, hashes: Sequence[int], instance_id: str) -> None:
        """`instance_id` now holds this prefix: it becomes the most recent holder of each block."""
        blocks = self._blocks
        held = self._held.setdefault(instance_id, OrderedDict())
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
                        self._held[dropped].pop(h, None)
                    del holders[self.instances_per_block :]
            held[h] = None
            held.move_to_end(h)
        if self.blocks_per_instance is not None:
            while len(held) > self.blocks_per_instance:
                self._drop(held.popitem(last=False)[0], instance_id)
        while len(blocks) > self.max_blocks:
            h, holders = blocks.popitem(last=False)
            for iid in holders:
                self._held[iid].pop(h, None)

    def forget_prefix(self, hashes: Sequence[int], instance_id: str) -> None:
        """`instance_id` no longer holds these blocks (its engine evicted them)."""
        held = self._held.get(instance_id)
        for h in hashes:
            if held is not None:
                held.pop(h, None)
            self._drop(h, instance_id)

    def forget(self, instance_id: str) -> None:
        """Drop an instance everywhere (it restarted: its cache is empty)."""
        for h in self._held.pop(instance_id, {}):
            self._drop(h, instance_id)

    def _drop(self, h: int, instance_id: str) -> None:
        holders = self._blocks.get(h)
        if holders and instance_id in holders:
            holders.remove(instance_id)
            if not holders:
                del self._blocks[h]
