"""Every `curl` in README.md and docs/*.md, run as printed against a live gateway.

Found where a reader copies from: a line of a fenced block that starts with `curl` (with
its `\\` continuation lines and any pipe), and an inline code span that starts with
`curl` and names a URL (`curl -v` alone is prose about curl). Substituted, and nothing
else: the port `8080` becomes the test gateway's; `tg-...` (a gateway key the reader
pastes) becomes a real key; `$TOKENGATE_ADMIN_KEY` is expanded by the shell from the
environment, as in the reader's. The gateway holds the objects the examples name (key
`team-a` of team `search`, which has a month cost budget; a price for the model the
quick start asks for; the admin key) in front of
`tokengate sim`. Each command runs in bash with `set -o pipefail` and `curl` made to fail
on an HTTP error (`--fail-with-body`), so an example the gateway refuses fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable

from tests.support.procs import ROOT, Gateway, GatewaySpec, Sim

Make = Callable[..., Gateway]
ADMIN = "admin-doc-curls-0123456789"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[\w-]*\n(.*?)^```", re.M | re.S)


def commands(text: str) -> list[str]:
    found = []
    for block in FENCE.findall(text):
        lines = block.split("\n")
        i = 0
        while i < len(lines):
            if lines[i].lstrip().startswith("curl "):
                command = lines[i]
                while command.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    command += "\n" + lines[i]
                found.append(command.strip())
            i += 1
    prose = FENCE.sub("", text)
    for span in re.findall(r"`(curl [^`]+)`", prose):
        command = " ".join(span.split())
        if "://" in command or "localhost:" in command:
            found.append(command)
    return found


def all_commands() -> list[tuple[str, str]]:
    return [(doc.name, c) for doc in DOCS for c in commands(doc.read_text())]


def test_the_extraction_finds_blocks_continuations_and_wrapped_spans() -> None:
    text = (
        "Run `curl -H 'A: b'\n'localhost:8080/x'` or `curl -v` (prose).\n"
        "```sh\ncurl -X PUT \\\n  -d '{}' localhost:8080/y\necho no\n```\n"
    )
    assert commands(text) == [
        "curl -X PUT \\\n  -d '{}' localhost:8080/y",
        "curl -H 'A: b' 'localhost:8080/x'",
    ]
    found = [c for _, c in all_commands()]
    assert len(found) >= 7, found  # chat, key limits x2, budgets x2, usage, snapshot
    assert any("/admin/budgets/team/search" in c for c in found)
    assert any("/admin/keys/team-a/limits" in c for c in found)


def test_every_curl_of_the_docs_runs_as_printed(sim: Sim, make_gateway: Make) -> None:
    spec = GatewaySpec(
        toml={"scale_up": {"api_style": "both"}},
        settings={
            "admin_key": ADMIN,
            "teams": [{"name": "search", "budgets": [{"period": "month", "max_cost": 2000}]}],
            "billing": {"prices": {"claude-sonnet": {"input": 3, "output": 15}}},
        },
        keys={"team-a": {"team": "search"}},
    )
    gw = make_gateway(spec, sim.url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENGATE_")}
    env["TOKENGATE_ADMIN_KEY"] = ADMIN
    ran = 0
    for doc, command in all_commands():
        runnable = command.replace(":8080", f":{gw.port}").replace("tg-...", gw.keys["team-a"])
        done = subprocess.run(
            [
                "bash",
                "-c",
                'set -o pipefail; curl() { command curl --show-error --fail-with-body "$@"; }\n'
                + runnable,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"{doc}:\n{command}\n{done.stdout}{done.stderr}"
        ran += 1
    assert ran == len(all_commands()) and ran >= 7
