"""The `tokengate` command line, one module per command (argv -> config -> exit code).

cli.py         the parser and dispatch: `tokengate serve | sim | check | keys new |
               config-reference | db ... | usage | audit` (the console script's entry)
serve.py       `serve`: uvicorn, one or N workers, SIGHUP reloads (banner.py: what it
               prints once bound)
check.py       `check`: the configuration, then the chain end to end (preflight.py:
               what `serve` checks before it binds)
sim.py         `sim`: the simulated upstream's flags
db.py          `db upgrade | current | check | backup | prune`
report.py      `usage`; changelog.py: `audit`; keys.py: `keys new`
demo.py        `make demo` (demo_text.py: what it prints)
"""
