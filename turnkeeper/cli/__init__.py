"""`turnkeeper` command line: the arguments and the dispatch.

Exit codes: 0 ok, 1 refused (reason on stderr), 2 bad usage, 3 the turn waits
for its user (`send`). One module per group of commands: `send` (and
`follow`, which `continue --wait` shares), `read` (status, history, events,
list), `decisions` (continue, dismiss, stop), `replay`; what they print is in
`output`, what they share in `common`.

Imports that only some commands need (the Temporal client and its RPC errors,
the models and pydantic, the session store, the worker, the web server) are
made in the functions that use them: every command pays for its own imports
only (tests/process/test_cli_startup.py).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Coroutine, Sequence
from typing import NoReturn

from turnkeeper.chat_ids import CHAT_ID_RULE, InvalidChatId, check_chat_id
from turnkeeper.cli.common import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, Refused
from turnkeeper.cli.decisions import cmd_continue, cmd_dismiss, cmd_stop
from turnkeeper.cli.read import cmd_events, cmd_history, cmd_list, cmd_status
from turnkeeper.cli.replay import cmd_replay
from turnkeeper.cli.send import cmd_send
from turnkeeper.client import MalformedMessage, check_message_id
from turnkeeper.config import ConfigError, Settings, import_from_working_directory
from turnkeeper.statuses import TurnStatus


class _Version(argparse.Action):
    """`--version`: the installed distribution's, read only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        from importlib.metadata import version

        print(f"turnkeeper {version('turnkeeper')}")
        parser.exit()


def _configured_by(names: Sequence[str]) -> str:
    """A server command's options are environment variables: its --help lists them."""
    import textwrap

    listed = textwrap.fill(", ".join(names), width=78, initial_indent="  ", subsequent_indent="  ")
    return (
        "Configured by environment variables, not flags:\n"
        f"{listed}\n"
        "Each is described in docs/configuration.md."
    )


def _server_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help_: str, names: Sequence[str]
) -> None:
    sub.add_parser(
        name,
        help=help_,
        description=help_[:1].upper() + help_[1:] + ".",
        epilog=_configured_by(names),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


JSON_HELP = 'print JSON: the result, or {"error": ..., "exit_code": ...}'


def build_parser() -> argparse.ArgumentParser:
    from turnkeeper.config import ENV_VARS

    p = argparse.ArgumentParser(prog="turnkeeper", description="Durable AI chat turns on Temporal.")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True)
    connection = [v for v in ENV_VARS if v.startswith("TEMPORAL_")] + [
        "TURNKEEPER_TASK_QUEUE",
        "TURNKEEPER_DATA_DIR",
        "TURNKEEPER_DATABASE_URL",
        "TURNKEEPER_ENCRYPTION_KEYS",
    ]
    _server_command(
        sub,
        "worker",
        "run a worker (starts the embedded dev server when TEMPORAL_ADDRESS is unset)",
        [v for v in ENV_VARS if not v.startswith(("TURNKEEPER_WEB_", "TURNKEEPER_CODEC_"))],
    )
    _server_command(
        sub,
        "web",
        "serve the HTTP API and the chat page (TURNKEEPER_WEB_ADDRESS, default 127.0.0.1:8000)",
        connection + [v for v in ENV_VARS if v.startswith("TURNKEEPER_WEB_")],
    )
    _server_command(
        sub,
        "codec-server",
        "decrypt and encrypt payloads for the Temporal UI and `temporal --codec-endpoint` "
        "(TURNKEEPER_CODEC_ADDRESS, default 127.0.0.1:8081)",
        ["TURNKEEPER_ENCRYPTION_KEYS"] + [v for v in ENV_VARS if v.startswith("TURNKEEPER_CODEC_")],
    )
    s = sub.add_parser("send", help="send a message and wait for the answer")
    s.add_argument("chat", type=_chat_id, help=CHAT_ID_RULE)
    s.add_argument("text", type=_text)
    s.add_argument("--no-wait", action="store_true", help="return once the message is durable")
    s.add_argument(
        "--message-id", type=_message_id, help="idempotency key, 1-200 characters (default: a new uuid)"
    )
    s.add_argument("--timeout", type=_seconds, default=600.0, help="seconds to wait (default 600)")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.set_defaults(func=cmd_send)
    for name, func, help_ in (
        ("status", cmd_status, "the turn's state"),
        ("history", cmd_history, "the committed transcript"),
    ):
        c = sub.add_parser(name, help=help_)
        c.add_argument("chat")
        c.add_argument("--json", action="store_true", help=JSON_HELP)
        c.set_defaults(func=func)
    e = sub.add_parser("events", help="the chat's event log")
    e.add_argument("chat")
    e.add_argument("--follow", "-f", action="store_true")
    e.add_argument("--json", action="store_true", help=JSON_HELP)
    e.add_argument("--after", type=int, default=0, help="only events after this seq")
    e.set_defaults(func=cmd_events)
    ls = sub.add_parser("list", help="chats by their latest turn")
    group = ls.add_mutually_exclusive_group()
    group.add_argument("--status", choices=[s.value for s in TurnStatus])
    group.add_argument("--awaiting", action="store_true", help="chats waiting for their user")
    ls.add_argument("--json", action="store_true", help=JSON_HELP)
    ls.set_defaults(func=cmd_list)
    for name, func, help_ in (
        ("continue", cmd_continue, "Continue an interrupted turn"),
        ("dismiss", cmd_dismiss, "Dismiss an interrupted turn"),
        ("stop", cmd_stop, "Stop the running turn"),
    ):
        c = sub.add_parser(name, help=help_)
        c.add_argument("chat")
        c.add_argument("--json", action="store_true", help=JSON_HELP)
        if name == "continue":
            c.add_argument(
                "--wait",
                action="store_true",
                help="follow the resumed turn like `send`: its tools, then its answer",
            )
            c.add_argument("--timeout", type=_seconds, default=600.0, help="seconds to wait (default 600)")
        c.set_defaults(func=func)
    r = sub.add_parser(
        "replay",
        help="replay recent histories against this code; exit 1 if any does not replay (the deploy gate)",
    )
    r.add_argument(
        "--limit",
        type=_positive,
        default=200,
        help="at most this many runs: running ones first, then the latest closed (default 200)",
    )
    r.add_argument(
        "--since",
        type=_since,
        default="24h",
        help="closed runs this recent, e.g. 30m, 24h, 7d (default 24h); running runs always",
    )
    r.add_argument("--json", action="store_true", help=JSON_HELP)
    r.set_defaults(func=cmd_replay)
    return p


def _since(raw: str) -> object:
    from turnkeeper.replay import parse_since

    try:
        return parse_since(raw)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _chat_id(raw: str) -> str:
    # Only where a chat can begin: the reads still reach a chat an older release started.
    try:
        return check_chat_id(raw)
    except InvalidChatId as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _text(raw: str) -> str:
    # Bytes that are not UTF-8 reach argv as lone surrogates, which no payload can carry.
    try:
        raw.encode()
    except UnicodeEncodeError as err:
        raise argparse.ArgumentTypeError(f"not UTF-8 text (at character {err.start + 1})") from None
    if not raw.strip():
        raise argparse.ArgumentTypeError("a message needs text (the page refuses a blank one too)")
    return raw


def _message_id(raw: str) -> str:
    # Refused here, before anything is sent: the message's model would refuse it later, in a traceback.
    try:
        check_message_id(raw)
    except MalformedMessage as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return raw


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {raw!r}")
    return value


def _positive(raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {raw!r}")
    return int(raw)


def run(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import_from_working_directory()
    if args.command == "worker":
        from turnkeeper.worker import main as worker

        worker.main()  # exits the process itself
    try:
        settings = Settings.from_env()
        if args.command == "web":
            from turnkeeper.web.main import serve
            from turnkeeper.web.server import WebConfig

            return serve(settings, WebConfig.from_settings(settings))
        if args.command == "codec-server":
            from turnkeeper.payloads.codec_server import CodecConfig
            from turnkeeper.payloads.codec_server import serve as serve_codec

            return serve_codec(settings, CodecConfig.from_settings(settings))
        code = args.func(args, settings)
        if isinstance(code, Coroutine):  # all but `status` and `list` run an event loop
            import asyncio

            code = asyncio.run(code)
        return code
    except ConfigError as err:
        return _failed(args, f"configuration error: {err}", EXIT_USAGE)
    except Refused as err:
        return _failed(args, str(err), EXIT_REFUSED)
    except Exception as err:
        # The store and the codec are imported lazily, so are their error classes: once something failed.
        from turnkeeper.payloads.encryption import DecryptionError
        from turnkeeper.store.base import StoreError

        if isinstance(err, DecryptionError):  # it names the key id, never any content
            return _failed(args, str(err), EXIT_REFUSED)
        if not isinstance(err, StoreError):
            raise
        # e.g. a row that does not decode, named in the message
        return _failed(args, f"session store: {err}", EXIT_REFUSED)
    except KeyboardInterrupt:
        return 130


def _failed(args: argparse.Namespace, why: str, code: int) -> int:
    """Said on stderr; with --json also as one JSON object on stdout."""
    print(f"turnkeeper: {why}", file=sys.stderr)
    if getattr(args, "json", False):
        import json

        print(json.dumps({"error": why, "exit_code": code}, ensure_ascii=False))
    return code


def main(argv: Sequence[str] | None = None) -> NoReturn:
    try:
        code = run(argv)
    except SystemExit as exit_:  # argparse: bad usage is 2
        code = exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`turnkeeper events CHAT | head`): nothing went wrong here.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_OK
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
    sys.stderr.flush()
    # os._exit would drop the spans still buffered. Only a traced client makes spans, and
    # it imported telemetry: a command that made none does not import it now.
    telemetry = sys.modules.get("turnkeeper.telemetry.exporters")
    if telemetry is not None:
        telemetry.flush_traces()
    # A Temporal runtime can abort at interpreter exit (sdk-python #300).
    os._exit(code)
