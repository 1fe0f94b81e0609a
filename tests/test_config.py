from pathlib import Path

import pytest

from gpuplane.config import load_settings, parse_settings
from gpuplane.errors import ConfigError

MINIMAL = """
models:
  - name: smollm2
    engine: llamacpp
    instances:
      - {url: "http://127.0.0.1:8101", max_concurrency: 1}
      - {url: "http://127.0.0.1:8102", max_concurrency: 1}
"""


def test_minimal_file_loads_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "gpuplane.yaml"
    path.write_text(MINIMAL)
    settings = load_settings(path)
    assert [m.name for m in settings.models] == ["smollm2"]
    assert [i.max_concurrency for i in settings.models[0].instances] == [1, 1]
    assert settings.gateway.port == 8000
    assert settings.tenants == []


def test_no_file_means_embedded_defaults() -> None:
    settings = load_settings(None)
    assert settings.engine.instances == 2
    assert settings.gateway.host == "127.0.0.1"


def test_unknown_key_names_the_nearest_valid_one() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'gateway.queue.timeout'.*'timeout_s'"):
        parse_settings({"gateway": {"queue": {"timeout": 3}}})


def test_unknown_key_inside_a_list_item() -> None:
    data = {"models": [{"name": "m", "instances": [{"url": "http://x", "max_concurency": 2}]}]}
    with pytest.raises(ConfigError, match=r"did you mean 'max_concurrency'"):
        parse_settings(data)


def test_invalid_values_are_refused_with_the_path() -> None:
    with pytest.raises(ConfigError, match=r"models\.0\.instances"):
        parse_settings({"models": [{"name": "m", "instances": []}]})
    with pytest.raises(ConfigError, match="max_concurrency"):
        parse_settings(
            {"models": [{"name": "m", "instances": [{"url": "u", "max_concurrency": 0}]}]}
        )


def test_duplicate_api_key_across_tenants_is_refused() -> None:
    tenants = [{"name": "a", "api_keys": ["k"]}, {"name": "b", "api_keys": ["k"]}]
    with pytest.raises(ConfigError, match="more than one tenant"):
        parse_settings({"tenants": tenants})


def test_lease_ttl_must_exceed_request_timeout() -> None:
    with pytest.raises(ConfigError, match="lease_ttl_s"):
        parse_settings({"gateway": {"request_timeout_s": 100, "lease_ttl_s": 50}})


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(bad)


def test_config_commands_print_defaults_and_check_files(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpuplane.cli.main import app

    runner = CliRunner()
    defaults = runner.invoke(app, ["config", "defaults"])
    assert defaults.exit_code == 0
    path = tmp_path / "gpuplane.yaml"
    path.write_text(defaults.stdout)
    assert load_settings(path) == load_settings(None)
    assert runner.invoke(app, ["config", "check", str(path)]).exit_code == 0
    path.write_text("gateway: {prot: 1}\n")
    bad = runner.invoke(app, ["config", "check", str(path)])
    assert bad.exit_code == 1
    reference = runner.invoke(app, ["config", "reference"])
    assert "`gateway.queue.timeout_s`" in reference.stdout
    assert "`models[].instances[].max_concurrency`" in reference.stdout


REFUSED_BY_EVERY_COMMAND = [
    pytest.param(
        "models: [{name: m, engine: simm, instances: [{url: 'http://127.0.0.1:1'}]}]\n",
        r"models\.0\.engine: unknown engine 'simm' \(did you mean 'sim'\?\)",
        id="engine-name",
    ),
    pytest.param(
        "models: [{name: m, engine: sim, instances: [{url: '127.0.0.1:8101'}]}]\n",
        r"instances\.0\.url: '127\.0\.0\.1:8101' is not an http\(s\) URL.*http://127\.0\.0\.1:8101",
        id="url-without-scheme",
    ),
    pytest.param(
        "control: {clusters: [{name: n, adapter: nomad}]}\n",
        r"clusters\.0\.adapter: unknown cluster adapter 'nomad'; valid: .*kubernetes",
        id="adapter-kind",
    ),
    pytest.param(
        "control: {policy: fgdd}\n",
        r"control\.policy: unknown scheduling policy 'fgdd' \(did you mean 'fgd'\?\)",
        id="policy-name",
    ),
]


@pytest.mark.parametrize(("text", "message"), REFUSED_BY_EVERY_COMMAND)
def test_config_check_refuses_what_the_servers_refuse(
    tmp_path: Path, text: str, message: str
) -> None:
    """`config check` and every server command run one validation: a file that check passes
    starts, and one that a server would refuse is refused by check with the same reason."""
    import re

    from typer.testing import CliRunner

    from gpuplane.cli.main import app

    path = tmp_path / "gpuplane.yaml"
    path.write_text(text)
    runner = CliRunner()
    for command in (
        ["config", "check", str(path)],
        ["gateway", "--config", str(path)],
        ["up", "--config", str(path)],
        ["control", "serve", "--config", str(path)],
    ):
        result = runner.invoke(app, command)
        assert result.exit_code == 1, (command, result.output)
        assert re.search(message, " ".join(result.output.split())), (command, result.output)
