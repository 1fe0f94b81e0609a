"""The gateway's limits against misbehaving clients: metrics labels that client input cannot
multiply."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serve.test_gateway import CHAT, gateway

pytestmark = pytest.mark.anyio


def samples(page: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
        if s.name == name
    }


def series(page: str) -> int:
    return sum(len(family.samples) for family in text_string_to_metric_families(page))


# -- metrics labels ---------------------------------------------------------------------------


async def test_unknown_model_names_share_one_metrics_label() -> None:
    """200 distinct 10,000-character model names cost /metrics no series and no bytes beyond
    the first one's (the count's digits aside)."""
    async with gateway(instances=1) as (base, client, _):
        url = f"{base}/v1/chat/completions"

        async def unknown(i: int) -> int:
            body = {**CHAT, "model": f"made-up-{i}-" + "x" * 10_000}
            return (await client.post(url, json=body)).status_code

        first = await unknown(0)
        page_after_one = (await client.get(f"{base}/metrics")).text
        statuses = [await unknown(i) for i in range(1, 200)]
        page = (await client.get(f"{base}/metrics")).text
    assert {first, *statuses} == {404}
    rejected = samples(page, "gpuplane_rejections_total")
    assert rejected == {(("model", "unknown"), ("reason", "unknown_model")): 200}
    assert series(page) == series(page_after_one)
    assert len(page) - len(page_after_one) < 10_000
    assert "made-up" not in page
