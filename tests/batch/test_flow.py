"""Which stage of a clip runs next (pure): readiness, downstream first, replicas and capacity,
cache hits, failed clips, and when the decoded clip is let go."""

from __future__ import annotations

from typing import Any

from gpuplane.batch.clips import ClipRef
from gpuplane.batch.flow import ClipState, Flow, Start, reads_clip
from gpuplane.batch.packing import PackingPlan, Replica
from gpuplane.batch.pipeline import CLIP, CachePolicy, Pipeline, Stage


def _fn(*args: Any) -> Any:
    return args


# perception reads the clip; lanes and checks read perception; report reads lanes and the clip
PIPE = Pipeline(
    "p",
    (
        Stage("perception", "1", _fn),
        Stage("lanes", "1", _fn, inputs=("perception",)),
        Stage("checks", "1", _fn, inputs=("perception",), cache=CachePolicy.OFF),
        Stage("report", "1", _fn, inputs=("lanes", CLIP)),
    ),
)


def plan(**replicas: int) -> PackingPlan:
    """One replica per stage unless told, all on gpu0."""
    counts = {s.name: replicas.get(s.name, 1) for s in PIPE.stages}
    made = tuple(Replica(n, i, "gpu0", 0.1, 0) for n, k in counts.items() for i in range(k))
    return PackingPlan(made, counts, dict.fromkeys(counts, 1.0), "perception", {"gpu0": 0.5})


def clip(ident: str, hits: dict[str, Any] | None = None, data: Any = b"raw") -> ClipState:
    ref = ClipRef(ident, f"memory:///{ident}", 3, ident, "size=3")
    state = ClipState(ref, {s.name: f"{ident}-{s.name}" for s in PIPE.stages}, data=data)
    state.values.update(hits or {})
    state.hits.extend(hits or {})
    return state


def fetched(flow: Flow, *clips: ClipState) -> list[bool]:
    for c in clips:
        flow.fetching(c.ref.id)
    return [flow.fetched(c) for c in clips]


def starts(flow: Flow, capacity: int = 100) -> list[tuple[str, str]]:
    """Every start `next_start` gives now, as (clip, stage)."""
    out = []
    while (s := flow.next_start(capacity)) is not None:
        out.append((s.clip.ref.id, s.stage.name))
    return out


def take(flow: Flow, capacity: int = 100) -> Start:
    start = flow.next_start(capacity)
    assert start is not None, "nothing could start"
    return start


def finish(flow: Flow, start: Start) -> bool:
    assert flow.ended(start)
    return flow.computed(start, f"{start.stage.name}-out", (0.1, 0.01))


def test_a_stage_is_ready_once_its_inputs_are_and_downstream_starts_first() -> None:
    flow = Flow(PIPE, plan(), cache_used=True)
    assert fetched(flow, clip("c1")) == [False]
    first = take(flow)
    assert (first.stage.name, first.args, first.key) == ("perception", (b"raw",), "c1-perception")
    assert flow.next_start(10) is None  # lanes and checks wait for perception
    assert not finish(flow, first)
    checks, lanes = take(flow), take(flow)  # the later stage first
    assert (checks.stage.name, lanes.stage.name) == ("checks", "lanes")
    assert checks.args == ("perception-out",)
    assert checks.key is None  # checks is never cached
    assert not finish(flow, lanes)
    report = take(flow)
    assert report.args == ("lanes-out", b"raw")
    assert not finish(flow, report)
    assert finish(flow, checks)  # the last stage completes the clip


def test_cache_hits_skip_their_stages_and_a_clip_of_hits_only_is_complete_at_once() -> None:
    flow = Flow(PIPE, plan(), cache_used=True)
    upstream = clip("c1", {"perception": "hit"})
    everything = clip("c2", {s.name: "hit" for s in PIPE.stages}, data=None)
    assert fetched(flow, upstream, everything) == [False, True]
    assert starts(flow) == [("c1", "checks"), ("c1", "lanes")]


def test_replicas_and_the_runner_capacity_bound_what_starts() -> None:
    flow = Flow(PIPE, plan(perception=2), cache_used=True)
    fetched(flow, clip("c1"), clip("c2"), clip("c3"))
    assert starts(flow, capacity=1) == [("c1", "perception")]
    assert starts(flow) == [("c2", "perception")]  # its second replica; none is left for c3
    assert flow.running == 2


def test_a_refused_start_frees_its_replica_for_the_next_attempt() -> None:
    flow = Flow(PIPE, plan(), cache_used=True)
    fetched(flow, clip("c1"), clip("c2"))
    flow.unstart(take(flow))
    assert flow.running == 0
    assert starts(flow) == [("c2", "perception")]


def test_a_failed_clip_frees_its_replica_and_its_queued_stages_are_skipped() -> None:
    flow = Flow(PIPE, plan(), cache_used=True)
    fetched(flow, clip("c1"), clip("c2"))
    running = take(flow)
    assert running.clip.ref.id == "c1"
    flow.drop("c2")  # c2 failed (its fetch, another stage) while c1 ran
    assert not flow.holds("c2")
    assert flow.ended(running)
    flow.drop("c1")  # then c1 failed too, before its result was recorded
    assert starts(flow) == []
    assert flow.idle


def test_the_result_of_a_task_whose_clip_failed_meanwhile_is_not_taken() -> None:
    flow = Flow(PIPE, plan(), cache_used=True)
    fetched(flow, clip("c1"))
    start = take(flow)
    flow.drop("c1")
    assert not flow.ended(start)
    assert flow.free["perception"]  # the replica is back all the same
    assert flow.running == 0


def test_the_decoded_clip_is_let_go_once_no_stage_left_reads_it() -> None:
    assert reads_clip(PIPE, {"perception", "lanes", "checks"})  # report reads it
    assert not reads_clip(PIPE, {"perception", "report"})
    flow = Flow(PIPE, plan(), cache_used=True)
    c = clip("c1", {"perception": "hit", "lanes": "hit"})
    fetched(flow, c)
    report, checks = take(flow), take(flow)
    assert report.stage.name == "report"
    finish(flow, report)
    assert c.data is None
    assert finish(flow, checks)


def test_without_a_cache_no_task_writes_an_entry() -> None:
    flow = Flow(PIPE, plan(), cache_used=False)
    fetched(flow, clip("c1"))
    assert take(flow).key is None
