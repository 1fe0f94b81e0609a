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
    def __init__(self, max_blocks: int, instances_per_block: int = 4) -> None:
        self.max_blocks = max_blocks
        self.instances_per_block = instances_per_block
        self._blocks: OrderedDict[int, list[str]] = OrderedDict()

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
                    del holders[self.instances_per_block :]
        while len(blocks) > self.max_blocks:
            blocks.popitem(last=False)

    def forget(self, instance_id: str) -> None:
        """Drop an instance everywhere (it restarted: its cache is empty)."""
        empty = []
        for h, holders in self._blocks.items():
            if instance_id in holders:
                holders.remove(instance_id)
                if not holders:
                    empty.append(h)
        for h in empty:
            del self._blocks[h]
