"""HAMi's registration of a node's cards: the `hami.io/node-nvidia-register` node annotation its
device plugin writes (and refreshes), in either of its two forms.

HAMi >= 2.4 writes a JSON list of `{"id", "index", "count", "devmem", "devcore", "type", "numa",
"mode", "health"}`; older plugins write `id,count,devmem,devcore,type,numa,health[,mode,index]`
entries each ended by `:`. `count` is how many vGPUs the card may be split into, `devmem` its
memory in MiB, `devcore` its compute in percent. A Pod is pinned to cards by UUID with the
`nvidia.com/use-gpuuuid` annotation, which HAMi's scheduler honours.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

REGISTER_ANNOTATION = "hami.io/node-nvidia-register"
USE_UUID_ANNOTATION = "nvidia.com/use-gpuuuid"
SPLITTABLE_MODE = "hami-core"  # "mig" cards split into fixed MIG profiles, not free slices


@dataclass(frozen=True, slots=True)
class HamiCard:
    uuid: str
    index: int
    count: int
    mem_mib: int
    cores: int
    type: str
    health: bool
    mode: str = SPLITTABLE_MODE

    @property
    def model(self) -> str:
        """gpuplane's model name: HAMi's type less the vendor prefix (`NVIDIA-A100-SXM4-80GB` ->
        `A100-SXM4-80GB`), spaces as '-', as the local adapter names nvidia-smi's."""
        return self.type.removeprefix("NVIDIA-").removeprefix("NVIDIA ").replace(" ", "-")

    @property
    def splittable(self) -> bool:
        return self.count > 1 and self.mode == SPLITTABLE_MODE


def parse_register(value: str) -> list[HamiCard]:
    """The cards of one annotation value; ValueError saying which entry is malformed."""
    text = value.strip()
    if not text:
        return []
    if text.startswith("["):
        try:
            entries = json.loads(text)
            return [
                HamiCard(
                    uuid=str(e["id"]),
                    index=int(e.get("index", i)),
                    count=int(e["count"]),
                    mem_mib=int(e["devmem"]),
                    cores=int(e["devcore"]),
                    type=str(e["type"]),
                    health=bool(e["health"]),
                    mode=str(e.get("mode") or SPLITTABLE_MODE),
                )
                for i, e in enumerate(entries)
            ]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"not HAMi's JSON device list ({type(exc).__name__}: {exc})") from None
    cards = []
    for i, entry in enumerate(e for e in text.split(":") if e.strip()):
        items = [s.strip() for s in entry.split(",")]
        if len(items) not in (7, 9):
            raise ValueError(
                f"entry {i} {entry!r} has {len(items)} fields, not 7 "
                "(id,count,devmem,devcore,type,numa,health) or 9 (…,mode,index)"
            )
        try:
            cards.append(
                HamiCard(
                    uuid=items[0],
                    index=int(items[8]) if len(items) == 9 else i,
                    count=int(items[1]),
                    mem_mib=int(items[2]),
                    cores=int(items[3]),
                    type=items[4],
                    health=items[6].lower() == "true",
                    mode=items[7] if len(items) == 9 else SPLITTABLE_MODE,
                )
            )
        except ValueError:
            raise ValueError(f"entry {i} {entry!r} has a non-numeric count or size") from None
    return cards
