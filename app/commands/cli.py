"""`tokengate serve | sim | check | keys new | config-reference | db ... | usage | audit`.

argv -> config -> exit codes: 0 success, 1 a failed check or runtime failure, 2 bad
configuration or usage, or a database that can not be used (one message naming file,
field and fix, or the command to run; never a traceback).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from app.config.problems import ConfigError
from app.config.sources import ConfigFiles, default_files
from app.db.unusable import DatabaseProblem


def _files(args: argparse.Namespace) -> ConfigFiles:
    base = default_files()
    return ConfigFiles(
        config=Path(args.config) if args.config else base.config,
        settings=Path(args.settings) if args.settings else base.settings,
    )


def _add_files(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", help="config.toml (default: $TOKENGATE_CONFIG or config/config.toml)"
    )
    p.add_argument(
        "--settings", help="settings.json (default: $TOKENGATE_SETTINGS or config/settings.json)"
    )


def _add_listen(p: argparse.ArgumentParser) -> None:
    """`serve`'s address and auth flags; `check` takes them to check what serve would do."""
    p.add_argument("--host", default=os.environ.get("TOKENGATE_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("TOKENGATE_PORT", "8080")))
    p.add_argument(
        "--no-auth", action="store_true", help="serve without gateway keys (trusted networks only)"
    )
    p.add_argument(
        "--upstream",
        help="point every domain at this upstream: a URL, or `sim` / `sim:PORT` for a running "
        "`tokengate sim` (then both API dialects, its key, logs to stderr, unless set)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokengate", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    _add_files(serve)
    _add_listen(serve)
    serve.add_argument("--workers", type=int, default=int(os.environ.get("TOKENGATE_WORKERS", "1")))

    from app.commands.sim import add_arguments as add_sim_arguments

    add_sim_arguments(sub.add_parser("sim", help="run the simulated OpenAI-compatible upstream"))

    check = sub.add_parser("check", help="validate config and verify the chain end to end")
    _add_files(check)
    check.add_argument("--target", help="verify a running gateway at this URL instead")
    check.add_argument("--key", help="gateway key for --target (default: $TOKENGATE_API_KEY)")
    _add_listen(check)

    keys = sub.add_parser("keys", help="manage gateway keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    new = keys_sub.add_parser("new", help="mint a key and print its settings line")
    new.add_argument("--alias", required=True)

    sub.add_parser("config-reference", help="print the configuration reference (Markdown)")

    db = sub.add_parser("db", help="the durable store: schema upgrades, backups, retention")
    _add_files(db)
    _add_db_commands(db)
    _add_usage(sub.add_parser("usage", help="usage and cost of a running gateway, by period"))
    _add_audit(sub.add_parser("audit", help="changes to limits, budgets, keys, prices, windows"))
    return parser


def _add_audit(audit: argparse.ArgumentParser) -> None:
    audit.add_argument("--since", default="7d", help="start: 7d, 24h, 90m, or an ISO date/instant")
    audit.add_argument("--until", help="end (exclusive), same forms; default now")
    audit.add_argument("--actor", help="only changes by this actor: admin, reload, expiry")
    audit.add_argument("--action", help="only this action (key_limits.set) or prefix (key.)")
    audit.add_argument("--on", help="only changes on this target (key:alice, model:gpt-4o)")
    audit.add_argument("--limit", type=int, default=100, help="newest rows shown (100)")
    audit.add_argument("--format", choices=["table", "json"], default="table")
    audit.add_argument(
        "--target",
        default=os.environ.get("TOKENGATE_URL", "http://127.0.0.1:8080"),
        help="the gateway's URL (default: $TOKENGATE_URL or http://127.0.0.1:8080)",
    )
    audit.add_argument("--admin-key", help="the admin key (default: $TOKENGATE_ADMIN_KEY)")


def _add_usage(usage: argparse.ArgumentParser) -> None:
    usage.add_argument(
        "--since", default="7d", help="start: 7d, 24h, 90m, 2w, or an ISO date/instant (7d)"
    )
    usage.add_argument("--until", help="end (exclusive), same forms; default now")
    usage.add_argument(
        "--by", default="key", help="key, team, model, domain, session, window, or a,b (key)"
    )
    usage.add_argument("--granularity", choices=["hour", "day"], help="one row per period")
    usage.add_argument("--format", choices=["table", "csv", "json"], default="table")
    usage.add_argument(
        "--target",
        default=os.environ.get("TOKENGATE_URL", "http://127.0.0.1:8080"),
        help="the gateway's URL (default: $TOKENGATE_URL or http://127.0.0.1:8080)",
    )
    usage.add_argument("--admin-key", help="the admin key (default: $TOKENGATE_ADMIN_KEY)")


def _add_db_commands(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="db_command", required=True)
    up = sub.add_parser("upgrade", help="migrate the schema to this tokengate's revision")
    up.add_argument("revision", nargs="?", default="heads", help="target (default: the newest)")
    sub.add_parser("current", help="print the schema revision and where the database is")
    sub.add_parser("check", help="exit 0 when the schema is at this tokengate's revision")
    backup = sub.add_parser("backup", help="write a consistent copy of the database to PATH")
    backup.add_argument("path")
    sub.add_parser("prune", help="apply ledger retention now (roll minutes into hours, ...)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except (ConfigError, DatabaseProblem) as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _point_at(args: argparse.Namespace) -> None:
    """`--upstream`: its variables set in this process (workers and reloads inherit them)."""
    if not getattr(args, "upstream", None):
        return
    from app.config.upstream_flag import variables

    try:
        added = variables(args.upstream, _files(args), os.environ)
    except ValueError as exc:
        print(f"tokengate: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    os.environ.update(added)


def _dispatch(args: argparse.Namespace) -> int:
    _point_at(args)
    if args.command == "serve":
        return _serve(args)
    if args.command == "sim":
        from app.commands.sim import run as run_sim

        code: int = run_sim(args)
        return code
    if args.command == "check":
        from app.commands.check import run_check

        return run_check(
            _files(args),
            target=args.target,
            key=args.key,
            host=args.host,
            port=args.port,
            no_auth=args.no_auth,
        )
    if args.command == "keys":
        from app.commands.keys import new

        print(new(args.alias))
        return 0
    if args.command == "db":
        return _db(args)
    if args.command == "usage":
        from app.commands.report import run as run_usage

        return run_usage(args)
    if args.command == "audit":
        from app.commands.changelog import run as run_audit

        return run_audit(args)
    if args.command == "config-reference":
        from app.config.reference import render

        print(render())
        return 0
    raise AssertionError(args.command)


def _serve(args: argparse.Namespace) -> int:
    from app.bootstrap import load_runtime

    files = _files(args)
    if args.workers < 1:
        raise SystemExit("tokengate: --workers must be >= 1")
    runtime = load_runtime(files, no_auth=args.no_auth, workers=args.workers)  # validate first
    from app.config.variables import warnings

    for line in warnings(os.environ):  # a typo pydantic-settings would ignore silently
        print(f"tokengate: warning: {line}", file=sys.stderr)
    from app.log import output_problem

    # The cheap local refusal before the database's: a missing log directory is said first.
    problem = output_problem(runtime.settings.logging.output, runtime.source)
    if problem is not None:
        raise ConfigError([problem])
    from app.commands.db import prepare_for_serve

    prepare_for_serve(runtime.settings)  # reachable, schema at head (an empty one created)
    os.environ["TOKENGATE_CONFIG"] = str(files.config)
    os.environ["TOKENGATE_SETTINGS"] = str(files.settings)
    from app.commands.serve import run_server

    if args.workers == 1:
        return run_server(runtime, args.host, args.port)
    os.environ["TOKENGATE_WORKERS"] = str(args.workers)
    os.environ["TOKENGATE_NO_AUTH"] = "1" if args.no_auth else "0"
    own_dir = not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    prom_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(
        prefix="tokengate-prom-"
    )
    for stale in Path(prom_dir).glob("*.db"):
        stale.unlink()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = prom_dir
    try:
        return run_server(runtime, args.host, args.port, workers=args.workers)
    finally:
        if own_dir:
            shutil.rmtree(prom_dir, ignore_errors=True)


def _db(args: argparse.Namespace) -> int:
    from app.commands.db import run
    from app.config.sources import load_settings, secret_environ

    return run(args, load_settings(_files(args), secret_environ()))


if __name__ == "__main__":
    raise SystemExit(main())
