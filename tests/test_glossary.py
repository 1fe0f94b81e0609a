"""The code speaks docs/glossary.md: no word the glossary retired comes back into src/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src" / "gpuplane"
RETIRED = {
    r"\bmilli_gpus\b": "gpu_milli",
    r"\bReservePolicy\b": "NominationPolicy",
    r"\breserve_after_s\b": "nominate_after_s",
    r"\bmax_reservations\b": "max_nominations",
    r"\breservation_node\b": "nomination_node",
    r"\bBlockedByReservation\b|\bBLOCKED_BY_RESERVATION\b": "BlockedByNomination",
    r"\bOnlineWorkload\b|\bfor_workload\b": "OnlineWorkloadMix, for_mix",
    r"\bplacements_of\b": "replicas_of",
}


def sources() -> list[Path]:
    return [p for p in SRC.rglob("*.py") if "migrations" not in p.parts]


@pytest.mark.parametrize(("pattern", "instead"), list(RETIRED.items()))
def test_no_retired_word_in_src(pattern: str, instead: str) -> None:
    found = [
        f"{path.relative_to(SRC)}:{n}"
        for path in sources()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(pattern, line)
    ]
    assert found == [], f"retired word (say {instead}; see docs/glossary.md): {found}"


def test_each_noun_is_one_class() -> None:
    """`FairQueue` is the gateway's, `Placement` the scheduler's, `Workload` the adapters'."""
    for name, home in (
        ("FairQueue", "serve/queue.py"),
        ("Placement", "control/scheduler"),
        ("Workload", "control/adapters"),
    ):
        homes = {
            str(p.relative_to(SRC))
            for p in sources()
            if re.search(rf"^class {name}\b", p.read_text(), re.M)
        }
        assert homes, name
        assert all(h.startswith(home) for h in homes), (name, homes)


def test_no_class_name_is_defined_twice() -> None:
    """One noun, one class: a name defined twice under src/ reads as the same thing in two
    places (the gateway's `Admission` is a granted slot, the control plane's answer to
    `can_admit` an `AdmissionDecision`)."""
    homes: dict[str, list[str]] = {}
    for path in sources():
        for name in re.findall(r"^class (\w+)", path.read_text(), re.M):
            homes.setdefault(name, []).append(str(path.relative_to(SRC)))
    twice = {name: where for name, where in homes.items() if len(where) > 1}
    assert twice == {}, f"class names defined twice (rename the less central): {twice}"
