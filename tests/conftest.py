"""Shared fixtures: the anyio backend, free ports, settings for a gateway, logging that no test
leaves configured for the next, and a checkout the suite leaves as it found it; the tests that
share a heavy per-session backend are pinned to one pytest-xdist worker."""

from __future__ import annotations

import itertools
import logging
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _pytest.nodeid import NodeId

from tests.control.pg_server import create_database, postgres_server

# Fixtures that start a backend too heavy to run twice at once on a small machine -> the
# pytest-xdist group whose one worker runs every test that asks for it (`--dist loadgroup`, as
# `make test` runs). Servers that are cheap to start (PostgreSQL, Redis, etcd) are started per
# worker instead: each on a free port with its files in a temp dir.
ONE_WORKER = {
    "ray_address": "ray",  # a local Ray cluster of two nodes (tests/control/adapters)
    "ray_cluster": "ray",  # Ray's own test cluster (tests/batch/test_ray.py)
    "token_cluster": "ray",  # a one-node cluster that requires a token (test_ray_auth.py)
}
# Module-scoped fixtures costly enough that each worker building its own copy shows: the tests
# of a module that use one run on one worker (a group per module), which builds it once.
ONCE_PER_MODULE = frozenset(
    {
        "prometheus",  # a Prometheus server scraping two exporters (test_collect_prometheus.py)
        "seed_fleet",  # a generated fleet and its audit (tests/audit/test_findings.py)
        "small_fleet",  # a generated fleet (tests/audit/test_report.py)
    }
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test that uses a fixture of `ONE_WORKER` with its group (one of
    `ONCE_PER_MODULE`: with its module's); on a `--dist loadgroup` worker, then give every test
    marked with a group the `@group` suffix on its node id by which the scheduler keeps a group
    on one worker. pytest-xdist 3.8 sets that suffix
    where pytest 9.2 no longer reads it (pytest-xdist issue 1386), so without this every group
    is spread over the workers and each of them starts its own Ray clusters. Runs last, after
    xdist's own hook: a suffix xdist did set is left as it is."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture in sorted(used & ONE_WORKER.keys()):
            item.add_marker(pytest.mark.xdist_group(ONE_WORKER[fixture]))
        if used & ONCE_PER_MODULE:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if not config.getoption("loadgroup", False):  # set on the workers of --dist loadgroup
        return
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})  # fmt: skip
        suffix = "@" + "_".join(groups)
        if groups and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


# what the tools running the suite write into a checkout, not the tests
TOOL_CACHES = frozenset(
    {"__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache"}
)


def untracked(root: Path) -> set[str] | None:
    """The untracked and ignored paths of the git checkout at `root` (`git status --porcelain
    --ignored`), the tools' caches aside; None when `root` is no git checkout (an sdist)."""
    git = shutil.which("git")
    if git is None:
        return None
    done = subprocess.run(
        [git, "status", "--porcelain", "--ignored", "-z"], cwd=root, capture_output=True
    )
    if done.returncode != 0:
        return None
    entries = [e.decode() for e in done.stdout.split(b"\0") if e]
    return {  # each entry "XY PATH"
        e[3:] for e in entries if e[:2] in ("??", "!!") and not TOOL_CACHES & set(Path(e[3:]).parts)
    }


@pytest.fixture(scope="session", autouse=True)
def _checkout_left_clean(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests write only under temp dirs: what the suite left in the checkout (a stage cache
    under .gpuplane/, say) would greet the next `make run` there. Compares the checkout's
    untracked and ignored paths before and after the session; fails the session's last
    teardown naming each new one."""
    root = Path(request.config.rootpath)
    before = untracked(root)
    yield
    after = untracked(root)
    if before is None or after is None:
        return
    new = sorted(after - before)
    assert not new, (
        f"the tests left {', '.join(new)} in the checkout {root}: write under tmp_path (the "
        "commands' defaults, such as batch.cache_url and control.state_dir, are relative to "
        "the working directory)"
    )


@pytest.fixture(scope="session", autouse=True)
def _ray_token_left_alone() -> Iterator[None]:
    """No test leaves Ray's token at ~/.ray/auth_token: once there, Ray 2.59+ turns token
    authentication on for every later cluster on the machine (the suite's own once failed so)."""
    token = Path.home() / ".ray" / "auth_token"
    had = token.exists()
    yield
    assert had or not token.exists(), (
        f"the tests left {token}: give a test's Ray cluster RAY_AUTH_MODE and a throwaway HOME "
        "(tests/control/adapters/ray_cluster.py)"
    )


@pytest.fixture(scope="session", autouse=True)
def _no_runner_terminal_width() -> Iterator[None]:
    """The CLI fits its tables to $COLUMNS; pytest-xdist's workers run with COLUMNS=80 and a
    serial run inherits the caller's. Tests see neither: a test about width sets its own."""
    with pytest.MonkeyPatch.context() as env:
        env.delenv("COLUMNS", raising=False)
        env.delenv("LINES", raising=False)
        yield


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """Commands run through Typer's runner call `logs.configure()`, which points the root logger
    at the runner's stderr; once that is closed, a later test's log lines would become logging
    errors in its output. Put the root logger back after each test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="session")
def pg_database() -> Iterator[Callable[[], str]]:
    """One throwaway PostgreSQL server for the session (`pg_server.py`); each call of what it
    gives creates a fresh database there and returns its URL."""
    names = itertools.count()
    with postgres_server() as url:
        yield lambda: create_database(url, f"t{next(names)}")
