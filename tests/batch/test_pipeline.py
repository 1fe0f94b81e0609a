"""The pipeline API: stage validation, cache keys, loading pipelines by path or module."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuplane.batch.errors import BatchError
from gpuplane.batch.pipeline import (
    CLIP,
    BoundStage,
    CachePolicy,
    Pipeline,
    Stage,
    cache_keys,
    load_pipeline,
    stage,
)
from tests.helpers.batch import TOY


def f(x: int, k: int = 1) -> int:
    return x * k


def g(x: int) -> int:
    return x + 1


def test_stage_rejects_bad_names_versions_and_params() -> None:
    with pytest.raises(BatchError, match="letters"):
        Stage("bad name", "1", f)
    with pytest.raises(BatchError, match="version"):
        Stage("a", "", f)
    with pytest.raises(BatchError, match="JSON"):
        Stage("a", "1", f, params={"obj": object()})


def test_pipeline_rejects_unknown_inputs_and_duplicates() -> None:
    a = Stage("a", "1", f)
    with pytest.raises(BatchError, match="not an earlier stage"):
        Pipeline("p", (Stage("b", "1", g, inputs=("nope",)), a))
    with pytest.raises(BatchError, match="twice"):
        Pipeline("p", (a, a))
    with pytest.raises(BatchError, match="no stages"):
        Pipeline("p", ())


def test_keys_change_with_version_params_upstream_and_clip() -> None:
    a, b = Stage("a", "1", f), Stage("b", "1", g, inputs=("a",))
    base = cache_keys(Pipeline("p", (a, b)), "clipfp")
    bumped_b = cache_keys(Pipeline("p", (a, b.with_version("2"))), "clipfp")
    assert bumped_b["a"] == base["a"]
    assert bumped_b["b"] != base["b"]
    bumped_a = cache_keys(Pipeline("p", (a.with_version("2"), b)), "clipfp")
    assert bumped_a["a"] != base["a"]
    assert bumped_a["b"] != base["b"]
    params = cache_keys(Pipeline("p", (Stage("a", "1", f, params={"k": 2}), b)), "clipfp")
    assert params["a"] != base["a"]
    assert cache_keys(Pipeline("p", (a, b)), "other")["a"] != base["a"]
    code = cache_keys(Pipeline("p", (Stage("a", "1", g), b)), "clipfp")
    assert code["a"] != base["a"]  # same name and version, different code


def test_decorator_and_bound_class_stage_built_once() -> None:
    built: list[int] = []

    class Model:
        def __init__(self, k: int) -> None:
            built.append(k)
            self.k = k

        def __call__(self, x: int) -> int:
            return x * self.k

    s = stage("m", version="3", params={"k": 5}, cache="off")(Model)
    assert s.version == "3"
    assert s.cache is CachePolicy.OFF
    assert s.inputs == (CLIP,)
    bound = BoundStage(s)
    assert [bound(1), bound(2)] == [5, 10]
    assert built == [5]
    assert BoundStage(Stage("f", "1", f, params={"k": 3}))(2) == 6


def test_load_pipeline_by_path_dir_module_and_versions(tmp_path: Path) -> None:
    p = load_pipeline(TOY, {"sum_check": "9"})
    assert p.name == "toy"
    assert p.stage("sum_check").version == "9"
    d = tmp_path / "pipe"
    d.mkdir()
    (d / "pipeline.py").write_text(Path(TOY).read_text())
    assert load_pipeline(str(d)).name == "toy"
    assert load_pipeline("tests.batch.toy_pipeline:build_pipeline").name == "toy"
    with pytest.raises(BatchError, match="does not exist"):
        load_pipeline(str(tmp_path / "missing.py"))
    with pytest.raises(BatchError, match="nor an importable module"):
        load_pipeline("no_such_module_xyz")
    with pytest.raises(BatchError, match="unknown pipeline attribute 'nothing'"):
        load_pipeline("tests.batch.toy_pipeline:nothing")
    with pytest.raises(BatchError, match="unknown stage 'nope'"):
        load_pipeline(TOY, {"nope": "2"})


def test_public_surface_is_importable() -> None:
    import gpuplane.batch as batch

    for name in batch.__all__:
        assert getattr(batch, name) is not None
