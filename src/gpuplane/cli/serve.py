"""`gpuplane gateway serve|status|usage|key create`, `gpuplane up` and `gpuplane chat`: the
online inference commands."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import typer
from rich.console import Console
from rich.markup import escape

from gpuplane import logs
from gpuplane.cli import _loop
from gpuplane.cli._control_common import OUTPUT_OPTION, Output, emit
from gpuplane.cli._invocation import invocation
from gpuplane.cli._secrets import secret_option
from gpuplane.cli.gateway_tables import state_tables, usage_table
from gpuplane.config import Settings, load_settings
from gpuplane.control.client import DEFAULT_SERVER
from gpuplane.errors import GpuplaneError

if TYPE_CHECKING:
    from gpuplane.plane import Plane

err = Console(stderr=True, soft_wrap=True)
DEFAULT_GATEWAY = "http://127.0.0.1:8000"
GATEWAY_ENV = "GPUPLANE_GATEWAY"
ADMIN_KEY_ENV = "GPUPLANE_ADMIN_KEY"

CONFIG_OPTION = typer.Option(None, "--config", "-c", help="gateway YAML (models, tenants)")
HOST_OPTION = typer.Option(None, help="listen address (overrides gateway.host)")
PORT_OPTION = typer.Option(None, help="listen port (overrides gateway.port)")
SERVER_OPTION = typer.Option(
    DEFAULT_GATEWAY, "--gateway", envvar=GATEWAY_ENV, help=f"gateway URL (${GATEWAY_ENV})"
)
ADMIN_KEY_OPTION = secret_option(
    "--admin-key", ADMIN_KEY_ENV, "admin key, needed once the gateway has keys"
)
CONTROL_OPTION = typer.Option(
    None,
    "--control",
    help="a control plane's URL: serve its deployments, found by watching it",
)
CONTROL_TOKEN_OPTION = secret_option(
    "--control-token",
    "GPUPLANE_TOKEN",
    "the control plane's API token (an admin's; default: the local admin token of a control "
    "plane on this machine)",
)


def _settings(config: Path | None, host: str | None, port: int | None) -> Settings:
    settings = load_settings(config)
    gateway = settings.gateway.model_copy(
        update={k: v for k, v in (("host", host), ("port", port)) if v is not None}
    )
    return settings.model_copy(update={"gateway": gateway})


def _fail(exc: Exception) -> typer.Exit:
    # escaped: messages quote engine logs and gateway answers, whose brackets are not markup
    err.print(f"[red]error:[/red] {escape(str(exc))}")
    return typer.Exit(1)


gateway_app = typer.Typer(invoke_without_command=True, no_args_is_help=True)


@gateway_app.callback()
def _gateway_group(
    ctx: typer.Context,
    config: Path | None = CONFIG_OPTION,
    host: str | None = HOST_OPTION,
    port: int | None = PORT_OPTION,
    control: str | None = CONTROL_OPTION,
    control_token: str | None = CONTROL_TOKEN_OPTION,
) -> None:
    """Serve and inspect the OpenAI-compatible gateway. `serve` it, read its `status` and its
    tenants' `usage`, or create API keys (`key create`).

    `gpuplane gateway --config FILE` (no command) is `gpuplane gateway serve --config FILE`.
    """
    if ctx.invoked_subcommand is None:
        gateway(config, host, port, control, control_token)
    elif any(v is not None for v in (config, host, port, control)):
        raise _fail(
            GpuplaneError(
                f"--config, --host, --port and --control go after the command: "
                f"`gpuplane gateway {ctx.invoked_subcommand} ...`"
            )
        )


@gateway_app.command("serve")
def gateway(
    config: Path | None = CONFIG_OPTION,
    host: str | None = HOST_OPTION,
    port: int | None = PORT_OPTION,
    control: str | None = CONTROL_OPTION,
    control_token: str | None = CONTROL_TOKEN_OPTION,
) -> None:
    """Serve the OpenAI-compatible gateway. In front of the configured engine instances, and
    (--control URL) the deployments of a control plane."""
    from gpuplane.serve.gateway import Gateway
    from gpuplane.serve.server import serve_until_signal

    logs.configure()
    try:
        if config is None and control is None:
            raise GpuplaneError(
                "the gateway needs its models: `gpuplane gateway serve --config FILE` (a YAML "
                "with a `models:` list) or `--control URL` (a control plane's deployments)"
            )
        settings = _settings(config, host, port)
        if not settings.models and control is None:
            raise GpuplaneError(
                f"{config} configures no models; add a `models:` list, or serve a control "
                "plane's deployments with --control URL"
            )
        gw = settings.gateway
        where = f"; serving the deployments of {control}" if control else ""
        if control is not None and control_token is None:
            from gpuplane.control.client import local_token

            control_token = local_token(control)

        async def serve() -> None:  # the gateway is made on the loop that runs it
            await serve_until_signal(
                settings,
                lambda: err.print(f"gateway listening on http://{gw.host}:{gw.port}{where}"),
                Gateway(settings, control=control, control_token=control_token),
            )

        _loop.settle_gc()
        _loop.run(serve())
    except GpuplaneError as exc:
        raise _fail(exc) from None


def up(
    config: Path | None = typer.Option(None, "--config", "-c", help="optional gpuplane.yaml"),
    instances: int | None = typer.Option(None, help="llama.cpp instances (engine.instances)"),
    host: str | None = typer.Option(None, help="gateway address"),
    port: int | None = typer.Option(None, help="gateway port"),
    control_port: int | None = typer.Option(
        None, help="control plane port (control.port); 0 picks a free one"
    ),
    verbose: bool = typer.Option(
        False,
        "--verbose",
        "-v",
        help="log each job, deployment and gateway event, not only warnings",
    ),
) -> None:
    """Start the whole plane on this machine. A control plane on loopback, a deployment of the
    embedded llama.cpp through it, and the gateway that finds its instances; Ctrl-C stops
    everything. Only warnings and errors are logged unless -v: the summary it prints once it
    serves says where everything is. One `up` (or `control serve`) per state dir: a second one
    is refused, naming the process that holds it, before it starts or stops anything."""
    from gpuplane.plane import embedded_control, run_up

    logs.configure(logging.INFO if verbose else logging.WARNING)
    try:
        settings = _settings(config, host, port)
        if instances is not None:
            engine = settings.engine.model_copy(update={"instances": instances})
            settings = settings.model_copy(update={"engine": engine})
        if control_port is not None:
            control = settings.control.model_copy(update={"port": control_port})
            settings = settings.model_copy(update={"control": control})
        control, team, note = embedded_control(settings.control, os.geteuid())
        if note:
            err.print(f"note: {note}", highlight=False)
        unused = sorted(settings.engine.model_fields_set & UNUSED_BY_UP)
        if unused:
            err.print(
                f"note: engine.{', engine.'.join(unused)} no longer apply: the control plane "
                "picks the engines' ports and restarts a crashed one (1 s, doubling to 60 s)",
                highlight=False,
            )
        err.print(
            f"starting the control plane and {settings.engine.instances} llama.cpp instance(s) ...",
            highlight=False,
        )
        _loop.settle_gc()
        _loop.run(run_up(settings, control, team, lambda plane: _print_usage(plane, settings)))
    except GpuplaneError as exc:
        raise _fail(exc) from None
    err.print("stopped: gateway, control plane and engines are down")


# what the supervisor of the previous `up` read; the control plane's deployments decide these
UNUSED_BY_UP = frozenset({"base_port", "host", "restart_backoff_s", "crash_loop_after"})


def _print_usage(plane: Plane, settings: Settings) -> None:
    model, base = plane.model, plane.gateway_url
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "Hi!"}], "stream": True}
    )
    chat_flag = "" if base == DEFAULT_GATEWAY else f" --server {base}"
    status_flag = "" if base == DEFAULT_GATEWAY else f" --gateway {base}"
    if any(t.digests for t in settings.tenants) or settings.gateway.admin.key_sha256:
        chat_flag += " --api-key @KEY_FILE"
        status_flag += " --admin-key @KEY_FILE"  # /admin/* and /metrics need it then
    server_flag = "" if plane.control_url == DEFAULT_SERVER else f" --server {plane.control_url}"
    run = invocation()
    hint = f"  ({escape(run.hint)})\n" if run.hint else ""
    cmd = escape(run.command)
    web = f"{plane.control_url}/ui"  # a one-time login link when `up` made one
    web = f"{plane.console_url}  (logs in once)" if plane.console_url else web
    err.print(
        f"""
[bold green]gpuplane is serving '{model}' ({plane.replicas} llama.cpp instance(s))[/bold green]
  gateway (OpenAI API)  {base}/v1   metrics: {base}/metrics
  control plane         {plane.control_url}   API docs: /docs
  web console           {web}
  admin token           {plane.token_file}

try:
{hint}  {cmd} chat{chat_flag} "What is a GPU?"
  {cmd} deploy list{server_flag}
  {cmd} gateway status{status_flag}
  curl -N {base}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'
Ctrl-C stops everything.
""",
        highlight=False,
    )


def chat(
    question: str = typer.Argument(..., help="what to ask"),
    server: str = typer.Option(
        os.environ.get("GPUPLANE_GATEWAY", DEFAULT_GATEWAY), help="gateway URL ($GPUPLANE_GATEWAY)"
    ),
    model: str = typer.Option("smollm2", help="model name"),
    api_key: str | None = secret_option("--api-key", "GPUPLANE_API_KEY", "tenant API key"),
    max_tokens: int = typer.Option(256, help="longest answer"),
    system: str | None = typer.Option(None, help="system prompt"),
) -> None:
    """Ask a question and stream the answer through the gateway."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": question})
    body = {"model": model, "messages": messages, "stream": True, "max_tokens": max_tokens}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = server.rstrip("/") + "/v1/chat/completions"
    try:
        with httpx.stream("POST", url, json=body, headers=headers, timeout=600) as response:
            if response.status_code != 200:
                response.read()
                raise GpuplaneError(
                    f"gateway answered {response.status_code}: {_message(response)}"
                )
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise GpuplaneError(f"the answer broke off: {event['error'].get('message')}")
                for choice in event.get("choices", []):
                    typer.echo((choice.get("delta") or {}).get("content") or "", nl=False)
        typer.echo()
    except httpx.HTTPError as exc:
        raise _fail(
            GpuplaneError(
                f"cannot reach the gateway at {server} ({exc}); is `gpuplane up` running?"
            )
        ) from None
    except GpuplaneError as exc:
        raise _fail(exc) from None


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]


@gateway_app.command()
def status(
    output: Output = OUTPUT_OPTION,
    server: str = SERVER_OPTION,
    admin_key: str | None = ADMIN_KEY_OPTION,
) -> None:
    """Show the gateway's instances, queues and HA role. Its role in HA (mode, role, epoch), its
    instances (model, state, in flight, capacity, last error) and each model's queue, from its
    /admin/state."""
    emit(admin_get(server, "/admin/state", admin_key), output, state_tables)


@gateway_app.command()
def usage(
    output: Output = OUTPUT_OPTION,
    server: str = SERVER_OPTION,
    admin_key: str | None = ADMIN_KEY_OPTION,
) -> None:
    """Show what each tenant used since the gateway started. Requests, prompt and completion tokens,
    slot-seconds, requests refused by its limits, and its limits' current windows, from its
    /admin/usage."""
    emit(admin_get(server, "/admin/usage", admin_key), output, usage_table)


def admin_get(server: str, path: str, admin_key: str | None) -> Any:
    """The JSON of an admin route; any failure exits non-zero saying what to do."""
    url = server.rstrip("/") + path
    headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=10)
        if response.status_code != 200:
            raise GpuplaneError(f"{url} answered {response.status_code}: {_message(response)}")
        return response.json()
    except httpx.HTTPError as exc:
        raise _fail(
            GpuplaneError(
                f"cannot reach the gateway at {server} ({exc}); is `gpuplane up` or "
                f"`gpuplane gateway serve` running? Point --gateway (${GATEWAY_ENV}) at it"
            )
        ) from None
    except GpuplaneError as exc:
        raise _fail(exc) from None


key_app = typer.Typer(no_args_is_help=True, help="API keys of tenants and admins.")
gateway_app.add_typer(key_app, name="key")


@key_app.command("create")
def key_create(
    name: str = typer.Argument(..., help="the tenant the key is for (or a name for an admin)"),
    admin: bool = typer.Option(False, "--admin", help="an admin key (/admin/*, /metrics)"),
) -> None:
    """Make a new API key and print it once. It is stored nowhere; the config lines printed with it
    hold its SHA-256 digest."""
    from gpuplane.serve.settings import key_digest
    from gpuplane.serve.tenants import new_key

    key = new_key()
    digest = key_digest(key)
    typer.echo(key)
    if admin:
        where = f"gpuplane.yaml (an admin key for {name})"
        lines = f"gateway:\n  admin:\n    key_sha256: [{digest}]"
    else:
        where = f"gpuplane.yaml, under tenant '{name}' (add to its key_sha256 list if it has one)"
        lines = f"tenants:\n  - name: {name}\n    key_sha256: [{digest}]"
    err.print(
        f"\nThe key above is shown once: hand it to its holder now.\nPaste into {where}:\n"
        f"\n{lines}\n",
        highlight=False,
        markup=False,
    )


def register(app: typer.Typer) -> None:
    app.add_typer(gateway_app, name="gateway")
    app.command()(up)
    app.command()(chat)
