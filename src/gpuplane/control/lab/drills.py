"""Self-healing drills against a running control plane and gateway (`gpuplane drill`, and the
benchmarks): streaming load through the gateway, one fault injected into a deployment
(`faults.py`), and how long each step of the recovery took, with what the clients saw.

The steps, each timed from the fault (`Recovery`, pure over what is observed):
- out of rotation: the gateway no longer admits to the victim instance (crash: goal <= 1 s);
- detected: the control plane noticed (crash: the instance's job is no longer running;
  node, cluster: the cluster is marked unreachable);
- switched: every instance the gateway admits to runs on another cluster than the lost one,
  and at least one does (cluster: goal <= 30 s);
- replaced: the gateway admits to as many instances as the deployment's replicas again, none
  of them the victim nor on the lost cluster (node: goal <= 10 s after detection).
A request that failed (a non-200 answer or a broken connection, after the gateway's own
retries) or was cut (200, then an error event in place of the rest) counts against the drill;
`retried` is how many times the gateway re-ran a request elsewhere meanwhile (its metrics).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpuplane.control.client import TOKEN_ENV, api_path, local_token, server_url
from gpuplane.errors import GpuplaneError

POLL_S = 0.05  # how often the gateway's and the control plane's views are read
FAILED_PAUSE_S = 0.1  # a load client's pause after a failed request


class DrillError(GpuplaneError):
    """The drill could not run (nothing serves the deployment, a refused fault...)."""


@dataclass(slots=True)
class Recovery:
    """The recovery steps reached so far, in seconds after the fault. Pure: `observe` is
    handed each look at the gateway and the control plane."""

    victim: str
    cluster: str  # the victim's; lost with it for a node or cluster fault
    replicas: int
    whole_cluster: bool  # node, cluster: every instance on `cluster` is lost too
    out_of_rotation_s: float | None = None
    detected_s: float | None = None
    switched_s: float | None = None
    replaced_s: float | None = None

    def observe(self, at_s: float, ready: Mapping[str, str | None], detected: bool) -> bool:
        """One look, `at_s` after the fault: `ready` maps each instance the gateway admits to
        onto its cluster (None: not known yet); `detected`: the control plane noticed. True
        once every step was reached."""
        if self.out_of_rotation_s is None and self.victim not in ready:
            self.out_of_rotation_s = at_s
        if self.detected_s is None and detected:
            self.detected_s = at_s
        healthy = [
            i
            for i, cluster in ready.items()
            if i != self.victim and not (self.whole_cluster and cluster == self.cluster)
        ]
        if self.switched_s is None and healthy and len(healthy) == len(ready):
            self.switched_s = at_s
        if self.replaced_s is None and len(healthy) >= self.replicas and len(healthy) == len(ready):
            self.replaced_s = at_s
        return None not in (
            self.out_of_rotation_s,
            self.detected_s,
            self.switched_s,
            self.replaced_s,
        )


@dataclass(slots=True)
class ClientTally:
    """What the load's clients saw."""

    ok: int = 0
    failed: int = 0
    cut: int = 0
    errors: list[str] = field(default_factory=list)  # the first few kinds of failure, in words

    def count(self, status: int, text: str) -> bool:
        """Count one answer (status 0: no answer, `text` the exception); True when it was
        whole."""
        if status == 200 and '"error"' not in text and "data: [DONE]" in text:
            self.ok += 1
            return True
        if status == 200:
            self.cut += 1
        else:
            self.failed += 1
        why = failure(status, text)
        if len(self.errors) < 5 and why not in self.errors:
            self.errors.append(why)
        return False


def failure(status: int, text: str) -> str:
    """What a client saw, in words: the message of the gateway's OpenAI-shaped error (a
    refusal, or the error event that cut a stream), never the raw body."""
    if status == 0:
        return f"no answer: {text}"
    if status == 200:
        events = [line.removeprefix("data: ") for line in text.splitlines()]
        errors = [e for e in events if '"error"' in e]
        why = _message(errors[-1]) if errors else None
        return f"cut mid-stream: {why or 'the stream ended without [DONE]'}"
    return f"HTTP {status}: {_message(text) or ' '.join(text.split()[:30]) or 'empty body'}"


def _message(body: str) -> str | None:
    """The message (and code) of an OpenAI-shaped error body; None when it is not one."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    if isinstance(error, str):
        return error
    if not isinstance(error, dict) or not error.get("message"):
        return None
    code = f" ({error['code']})" if error.get("code") else ""
    return f"{error['message']}{code}"


@dataclass(frozen=True, slots=True)
class DrillResult:
    fault: str
    deployment: str
    instance: str  # the victim
    cluster: str
    node: str | None
    recovered: bool  # every step reached before the drill's timeout
    out_of_rotation_s: float | None
    detected_s: float | None
    switched_s: float | None
    replaced_s: float | None
    requests: int
    failed: int
    cut: int
    retried: int
    errors: list[str]

    @property
    def replaced_after_detection_s(self) -> float | None:
        if self.replaced_s is None or self.detected_s is None:
            return None
        return self.replaced_s - self.detected_s

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "replaced_after_detection_s": self.replaced_after_detection_s}


async def run_drill(
    fault: str,
    deployment: str,
    *,
    control: str | None = None,
    gateway: str,
    control_token: str | None = None,
    admin_key: str | None = None,
    api_key: str | None = None,
    clients: int = 4,
    max_tokens: int = 32,
    lost_for_s: float = 60.0,
    timeout_s: float = 120.0,
    settle_s: float = 2.0,
) -> DrillResult:
    """Put `clients` streams of load on `deployment` through `gateway`, inject `fault`, and
    follow the recovery until every step is reached (or `timeout_s`), then `settle_s` more."""
    server = server_url(control)
    token = control_token or os.environ.get(TOKEN_ENV) or local_token(server)
    ctl = httpx.AsyncClient(
        base_url=server,
        timeout=30.0,
        headers={"authorization": f"Bearer {token}"} if token else None,
    )
    gw = httpx.AsyncClient(base_url=gateway.rstrip("/"), timeout=httpx.Timeout(600.0, connect=10.0))
    admin = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
    try:
        described = await _json(
            ctl.get(api_path("/deployments/{}", deployment)), "the control plane"
        )
        replicas = int(described["replicas"])
        ready = await _ready(gw, admin, ctl, deployment)
        if len(ready) < replicas:
            raise DrillError(
                f"the gateway at {gateway} admits to {len(ready)} of the {replicas} instance(s) "
                f"of {deployment}; run the drill once it serves them all "
                f"(`gpuplane deploy describe {deployment}`)"
            )
        retries_before = await _retries(gw, admin, deployment)
        tally = ClientTally()
        stop = asyncio.Event()
        load = [
            asyncio.create_task(_client(gw, deployment, max_tokens, api_key, tally, stop))
            for _ in range(clients)
        ]
        try:
            await asyncio.sleep(settle_s)
            hit, recovery, done = await _inject_and_follow(
                ctl, gw, admin, fault, deployment, replicas, lost_for_s, timeout_s
            )
            await asyncio.sleep(settle_s)
        finally:
            stop.set()
            await asyncio.gather(*load)
        retried = await _retries(gw, admin, deployment) - retries_before
    finally:
        await ctl.aclose()
        await gw.aclose()
    return DrillResult(
        fault=fault,
        deployment=deployment,
        instance=hit["instance"],
        cluster=hit["cluster"],
        node=hit["node"],
        recovered=done,
        out_of_rotation_s=recovery.out_of_rotation_s,
        detected_s=recovery.detected_s,
        switched_s=recovery.switched_s,
        replaced_s=recovery.replaced_s,
        requests=tally.ok + tally.failed + tally.cut,
        failed=tally.failed,
        cut=tally.cut,
        retried=int(retried),
        errors=tally.errors,
    )


async def _inject_and_follow(
    ctl: httpx.AsyncClient,
    gw: httpx.AsyncClient,
    admin: Mapping[str, str],
    fault: str,
    deployment: str,
    replicas: int,
    lost_for_s: float,
    timeout_s: float,
) -> tuple[dict[str, Any], Recovery, bool]:
    """Inject `fault` and look at the gateway and the control plane every `POLL_S` until every
    step of the recovery is reached or `timeout_s` has passed: the victim, the recovery, and
    whether it completed."""
    started = time.monotonic()
    hit = await _json(
        ctl.post(
            api_path("/deployments/{}/faults", deployment),
            json={"fault": fault, "lost_for_s": lost_for_s},
        ),
        "the control plane",
    )
    recovery = Recovery(hit["instance"], hit["cluster"], replicas, fault != "crash")
    done = False
    while not done and time.monotonic() - started < timeout_s:
        ready = await _ready(gw, admin, ctl, deployment)
        detected = await _detected(ctl, fault, deployment, hit)
        done = recovery.observe(time.monotonic() - started, ready, detected)
        await asyncio.sleep(POLL_S)
    return hit, recovery, done


async def _json(call: Any, what: str) -> Any:
    try:
        response: httpx.Response = await call
    except httpx.HTTPError as exc:
        raise DrillError(f"cannot reach {what}: {exc}") from None
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise DrillError(f"{what} answered {response.status_code}: {detail}")
    return response.json()


async def _ready(
    gw: httpx.AsyncClient, admin: Mapping[str, str], ctl: httpx.AsyncClient, deployment: str
) -> dict[str, str | None]:
    """The instances of `deployment` the gateway admits to now, with their clusters."""
    state = await _json(gw.get("/admin/state", headers=admin), "the gateway")
    ids = [
        i["id"] for i in state["instances"] if i["model"] == deployment and i["state"] == "ready"
    ]
    if not ids:
        return {}
    described = await _json(ctl.get(api_path("/deployments/{}", deployment)), "the control plane")
    where = {i["id"]: i["cluster"] for i in described["instances"]}
    return {i: where.get(i) for i in ids}


async def _detected(
    ctl: httpx.AsyncClient, fault: str, deployment: str, hit: Mapping[str, Any]
) -> bool:
    if fault == "crash":
        described = await _json(
            ctl.get(api_path("/deployments/{}", deployment)), "the control plane"
        )
        states = {i["id"]: i["state"] for i in described["instances"]}
        return states.get(hit["instance"]) != "running"
    cluster = await _json(ctl.get(api_path("/clusters/{}", hit["cluster"])), "the control plane")
    return bool(cluster["health"] == "unreachable")


async def _retries(gw: httpx.AsyncClient, admin: Mapping[str, str], model: str) -> float:
    """The gateway's `gpuplane_retries_total` for `model`."""
    try:
        response = await gw.get("/metrics", headers=admin)
    except httpx.HTTPError as exc:
        raise DrillError(f"cannot reach the gateway: {exc}") from None
    if response.status_code != 200:
        raise DrillError(
            f"the gateway's /metrics answered {response.status_code}: pass --admin-key"
        )
    for family in text_string_to_metric_families(response.text):
        if family.name == "gpuplane_retries":
            return sum(s.value for s in family.samples if s.labels.get("model") == model)
    return 0.0


async def _client(
    gw: httpx.AsyncClient,
    model: str,
    max_tokens: int,
    api_key: str | None,
    tally: ClientTally,
    stop: asyncio.Event,
) -> None:
    """One client of the load: a streamed chat completion after another until `stop`."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "drill"}],
        "stream": True,
        "max_tokens": max_tokens,
    }
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    while not stop.is_set():
        try:
            async with gw.stream(
                "POST", "/v1/chat/completions", json=body, headers=headers
            ) as response:
                text = (await response.aread()).decode(errors="replace")
            ok = tally.count(response.status_code, text)
        except httpx.HTTPError as exc:
            ok = tally.count(0, f"{type(exc).__name__}: {exc}")
        if not ok:  # as a client does; a 503 answers at once, and a tight loop of them would
            await asyncio.sleep(FAILED_PAUSE_S)  # take the CPU from the recovery it measures
