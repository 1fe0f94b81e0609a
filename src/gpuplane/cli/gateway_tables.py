"""The tables `gpuplane gateway status` and `gateway usage` print from the gateway's admin
routes (`/admin/state`, `/admin/usage`); JSON and YAML output print the answer as it is."""

from __future__ import annotations

from typing import Any

from gpuplane.cli._control_common import print_table


def usage_table(usage: dict[str, Any]) -> None:
    """`gateway usage`: one row per tenant, from the gateway's /admin/usage."""

    def limits(tenant: dict[str, Any]) -> str:
        return (
            ", ".join(
                f"{w['kind']} {w['used'] + w['reserved']}/{w['limit']} per {w['window_s']:g} s "
                f"(resets in {w['resets_in_s']:.0f} s)"
                for w in tenant["limits"]
            )
            or "-"
        )

    print_table(
        [
            "TENANT",
            "REQUESTS",
            "PROMPT TOKENS",
            "COMPLETION TOKENS",
            "ESTIMATED",
            "SLOT-S",
            "LIMITED",
            "LIMITS",
        ],
        [
            (
                t["tenant"],
                t["requests"],
                t["prompt_tokens"],
                t["completion_tokens"],
                t["estimated_prompt_tokens"] + t["estimated_completion_tokens"],
                f"{t['slot_seconds']:.1f}",
                ", ".join(f"{k}={n}" for k, n in t["limited"].items()) or "-",
                limits(t),
            )
            for t in usage["tenants"]
        ],
    )


def _ha_row(ha: dict[str, Any]) -> tuple[object, ...]:
    """This gateway's part in HA: its mode, role and epoch, and who else is there."""
    if ha["mode"] == "shared":
        others = f"gateways {', '.join(ha['gateways']) or '-'}"
        return ha["mode"], ha["role"], ha["epoch"], f"{ha['gateway_id']}; {others}"
    leader = ha["leader"] or "-"
    at = f" at {ha['leader_url']}" if ha["leader_url"] else ""
    return ha["mode"], ha["role"], ha["epoch"] or "-", f"{ha['holder']}; leader {leader}{at}"


def _cache_cell(cache: dict[str, Any]) -> str:
    """How many prompt blocks the gateway assumes the instance's cache keeps, and what it
    learned that from (the engine's cached-token counts, or times to first token)."""
    kept = "unbounded" if cache["blocks"] is None else f"{cache['blocks']} blocks"
    return f"{kept} (by {cache['learned_from']})"


def state_tables(state: dict[str, Any]) -> None:
    """`gateway status`: its HA role, its instances and its models' queues, from /admin/state."""
    if "ha" in state:
        print_table(["HA MODE", "ROLE", "EPOCH", "THIS GATEWAY; OTHERS"], [_ha_row(state["ha"])])
    print_table(
        ["MODEL", "INSTANCE", "STATE", "IN FLIGHT", "CAPACITY", "PREFIX CACHE", "LAST ERROR"],
        [
            (
                i["model"],
                i["id"],
                i["state"],
                i["in_flight"],
                i["capacity"],
                _cache_cell(i["prefix_cache"]),
                i["last_error"] or "-",
            )
            for i in state["instances"]
        ],
        drop=("PREFIX CACHE", "CAPACITY", "IN FLIGHT"),
    )
    print_table(
        ["MODEL", "QUEUED", "QUEUED BY TENANT", "STREAM USAGE"],
        [
            (
                m["name"],
                m["queued"],
                ", ".join(f"{t}={n}" for t, n in m["queued_by_tenant"].items()) or "-",
                m.get("stream_usage", "-"),
            )
            for m in state["models"]
        ],
    )
