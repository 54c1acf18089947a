"""Every copy-paste example of README.md and docs/*.md still works, and every link lands.

What a reader copies is checked the way it will be used: a settings.json or config.toml
snippet is loaded by the real configuration loader (merged into the shipped files, so
it must validate against the schema); a `TOKENGATE_*` assignment in a shell block is
loaded too; every `TOKENGATE_*` name anywhere in the text is one tokengate reads; a
`tokengate ...` command names a real subcommand and real flags (asked of the installed
console script's `--help`, so it follows the CLI wherever its code lives); `make X`
names a Makefile target and `python -m X` a module; a Python block compiles; a YAML block
parses; every relative link and anchor lands. The `curl`
lines run against a live gateway in tests/e2e/test_doc_curls.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config.reference import render
from app.config.sources import ConfigFiles, load_settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.M | re.S)
SHA = "0" * 64


def blocks(lang: str) -> Iterator[tuple[str, str]]:
    for doc in DOCS:
        for found, body in FENCE.findall(doc.read_text()):
            if found == lang:
                yield f"{doc.name}: {body[:60]!r}", body


def ids(pairs: list[tuple[str, str]]) -> list[str]:
    return [name for name, _ in pairs]


# --- settings snippets -------------------------------------------------------------------

JSON_BLOCKS = list(blocks("json"))
TOML_BLOCKS = [(n, b) for n, b in blocks("toml") if "model_provider" not in b]  # Codex's own


def as_object(snippet: str) -> dict[str, Any]:
    """A snippet is an object, or members of one (`"billing": {...},` as pasted inside)."""
    try:
        value = json.loads(snippet)
    except json.JSONDecodeError:
        value = json.loads("{" + snippet.strip().rstrip(",") + "}")
    assert isinstance(value, dict)
    return value


def fill(value: Any) -> Any:
    """The reader's placeholders (`"..."` digests, `<sha256>`) as values they would paste."""
    if isinstance(value, dict):
        return {
            k: SHA if k == "key_sha256" and v in ("...", "<sha256>") else fill(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [fill(v) for v in value]
    return value


def load(tmp_path: Path, settings: dict[str, Any], toml: str | None = None) -> None:
    shipped = json.loads((ROOT / "config" / "settings.json").read_text())
    config, path = tmp_path / "config.toml", tmp_path / "settings.json"
    config.write_text(toml if toml is not None else (ROOT / "config/config.toml").read_text())
    path.write_text(json.dumps({**shipped, **settings}))
    names = re.findall(r"\$\{(\w+)\}", path.read_text())
    environ = {"TAOTOKEN_API_KEY": "sk-doc", **{n: "doc-value" for n in names}}
    load_settings(ConfigFiles(config, path), environ)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("TOKENGATE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TOKENGATE_ALERTS_SECRET", "doc-secret")  # alerts.secret_env's
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-doc")
    return monkeypatch


@pytest.mark.parametrize("snippet", [b for _, b in JSON_BLOCKS], ids=ids(JSON_BLOCKS))
def test_each_json_snippet_validates_against_the_schema(
    snippet: str, tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    load(tmp_path, fill(as_object(snippet)))


@pytest.mark.parametrize("snippet", [b for _, b in TOML_BLOCKS], ids=ids(TOML_BLOCKS))
def test_each_toml_snippet_validates_against_the_schema(
    snippet: str, tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    tomllib.loads(snippet)
    for var in re.findall(r'api_key_env = "(\w+)"', snippet):
        clean_env.setenv(var, "sk-doc")
    load(tmp_path, {}, snippet)


# --- environment variables ---------------------------------------------------------------

SHELL = [*blocks("sh"), *blocks("bash")]
ASSIGN = re.compile(r"(?:^|\s|export\s+)(TOKENGATE_[A-Z0-9_]+)=('[^']*'|\"[^\"]*\"|\S*)")


@cache
def variables() -> frozenset[str]:
    """Every TOKENGATE_* name tokengate reads: the reference's rows and its other list."""
    return frozenset(re.findall(r"`(TOKENGATE_[A-Z0-9_]+)`", render()))


def test_every_tokengate_variable_named_in_the_docs_is_read() -> None:
    known = variables()
    assert "TOKENGATE_RATE_LIMIT__TOKENS_PER_MINUTE" in known and "TOKENGATE_CONFIG" in known
    wrong = []
    for doc in DOCS:
        for name, star in re.findall(r"(TOKENGATE_[A-Z0-9_]*)(\*?)", doc.read_text()):
            if name in ("TOKENGATE_", "TOKENGATE_BENCH_"):  # `TOKENGATE_<SECTION>__<FIELD>`
                continue
            if star and any(k.startswith(name) for k in known):
                continue
            if name not in known:
                wrong.append(f"{doc.name}: {name}{star}")
    assert not wrong, wrong


def groups(body: str) -> Iterator[dict[str, str]]:
    """The assignments a reader pastes together: one paragraph of a shell block (a block
    may show alternatives one paragraph each; a commented-out line is prose)."""
    for paragraph in body.split("\n\n"):
        code = "\n".join(ln for ln in paragraph.split("\n") if not ln.lstrip().startswith("#"))
        found = dict(ASSIGN.findall(code))
        if found:
            yield found


ASSIGNMENTS = [(f"{where}: {sorted(g)}", g) for where, body in SHELL for g in groups(body)]


def pasted(value: str) -> str:
    """A value as the shell hands it over; `...` and `$(...)` are the reader's to fill."""
    value = value[1:-1] if value[:1] in "'\"" else value
    if value in ("", "...") or value.startswith("$("):
        return "doc-secret-value"
    return value


@pytest.mark.parametrize("group", [g for _, g in ASSIGNMENTS], ids=[i for i, _ in ASSIGNMENTS])
def test_each_group_of_assignments_in_a_shell_block_is_accepted(
    group: dict[str, str], tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    for name, value in group.items():
        assert name in variables(), name
        clean_env.setenv(name, pasted(value))
    load(tmp_path, {})


# --- commands ----------------------------------------------------------------------------

CONSOLE = Path(sys.executable).parent / "tokengate"


@cache
def cli_help(*path: str) -> str:
    done = subprocess.run(
        [str(CONSOLE), *path, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, (path, done.stderr)
    return done.stdout


def subcommands(help_text: str) -> set[str]:
    """The choices argparse lists as `{serve,sim,...}` in a usage line."""
    found = re.search(r"\{([\w,-]+)\}", help_text)
    return set(found.group(1).split(",")) if found else set()


def tokengate_commands() -> Iterator[tuple[str, list[str]]]:
    """`tokengate ...` as a command line in shell blocks and inline code spans."""
    for doc in DOCS:
        text = doc.read_text()
        for lang, body in FENCE.findall(text):
            if lang not in ("sh", "bash"):
                continue
            for line in body.replace("\\\n", " ").split("\n"):
                for part in re.split(r"&&|\|\||[|;]", line.split(" #")[0]):
                    words = part.split()
                    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
                        words.pop(0)
                    if words and (words[0] == "tokengate" or words[0].endswith("/tokengate")):
                        yield f"{doc.name}: {part.strip()}", words[1:]
        for span in re.findall(r"`(tokengate [a-z][^`]*)`", FENCE.sub("", text)):
            yield f"{doc.name}: {span}", span.split()[1:]


COMMANDS = list(tokengate_commands())


@pytest.mark.parametrize("argv", [a for _, a in COMMANDS], ids=[i for i, _ in COMMANDS])
def test_each_tokengate_command_names_real_subcommands_and_flags(argv: list[str]) -> None:
    path: list[str] = []
    words = [w for w in argv if w not in ("...", "[...]")]
    while words and words[0] in subcommands(cli_help(*path)):
        path.append(words.pop(0))
    assert path, f"no such subcommand: {argv}"
    helps = [cli_help(*path[:n]) for n in range(1, len(path) + 1)]
    flags = re.findall(r"(?<![\w-])(--[a-z][\w-]*)", "\n".join(helps))
    for word in words:
        flag = word.split("=")[0].strip("[]")
        if flag.startswith("--") and not flag.endswith("-*"):
            assert flag in flags, f"`tokengate {' '.join(path)}` has no {flag}"


def test_the_command_extraction_finds_blocks_spans_and_prefixed_variables() -> None:
    found = {" ".join(argv) for _, argv in COMMANDS}
    assert "keys new --alias team-a" in found
    assert "serve --upstream sim --no-auth" in found
    assert any(argv[:1] == ["usage"] for _, argv in COMMANDS)


@cache
def make_targets() -> frozenset[str]:
    return frozenset(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def test_each_make_target_named_in_the_docs_exists() -> None:
    wrong = []
    for doc in DOCS:
        text = doc.read_text()
        lines = [
            ln
            for lang, body in FENCE.findall(text)
            if lang in ("sh", "bash")
            for ln in body.split("\n")
        ]
        spans = re.findall(r"`(make [^`]+)`", FENCE.sub("", text))
        for cmd in [*spans, *(ln for ln in lines if ln.startswith("make "))]:
            for word in cmd.split("#")[0].split()[1:]:
                if "=" not in word and word not in make_targets():
                    wrong.append(f"{doc.name}: {cmd}")
    assert not wrong, wrong


def test_each_module_run_with_python_m_exists() -> None:
    wrong = []
    for doc in DOCS:
        for module in re.findall(r"python -m ([\w.]+)", doc.read_text()):
            path = ROOT / module.replace(".", "/")
            if not (path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()):
                wrong.append(f"{doc.name}: python -m {module}")
    assert not wrong, wrong


# --- code ---------------------------------------------------------------------------------

PYTHON = list(blocks("python"))
YAML = list(blocks("yaml"))


@pytest.mark.parametrize("snippet", [b for _, b in PYTHON], ids=ids(PYTHON))
def test_each_python_snippet_compiles(snippet: str) -> None:
    compile(snippet, "<doc>", "exec")


@pytest.mark.parametrize("snippet", [b for _, b in YAML], ids=ids(YAML))
def test_each_yaml_snippet_parses(snippet: str) -> None:
    assert yaml.safe_load(snippet)


# --- the pages themselves -----------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    text = FENCE.sub("", doc.read_text())
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_every_relative_link_and_anchor_lands() -> None:
    wrong = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", doc.read_text())):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (doc.parent / file).resolve() if file else doc
            if not dest.exists():
                wrong.append(f"{doc.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                wrong.append(f"{doc.name}: {target} (no such heading)")
    assert not wrong, wrong


# `app/x.py`, `tests/y/test_z.py::test_name`, `app/room/`: not `/app/...` (a container path)
CODE_PATH = re.compile(r"(?<![\w/.-])((?:app|tests)/[\w/.]*[\w/])(?:::(\w+))?")
GENERATED = "tests/bench/results"  # what `make bench` writes (not in git)
DEPLOY_TEXTS = sorted(
    p for p in (ROOT / "deploy").rglob("*") if p.suffix in {".md", ".yml", ".yaml"}
)


def test_every_module_and_test_named_in_the_docs_exists() -> None:
    """A path into the code (or a test by its name) in README.md, docs/ or deploy/ names a
    file, a room or a test that is there: a move or a rename updates the text with it."""
    wrong = []
    for doc in [*DOCS, *DEPLOY_TEXTS]:
        for path, test in CODE_PATH.findall(doc.read_text()):
            if path.startswith(GENERATED):
                continue
            where = ROOT / path.rstrip("/.")
            if not where.exists():
                wrong.append(f"{doc.name}: {path} (no such file or directory)")
            elif test and not re.search(rf"^(async )?def {test}\(", where.read_text(), re.M):
                wrong.append(f"{doc.name}: {path}::{test} (no such test)")
    assert not wrong, wrong


def test_the_readme_is_a_way_in_not_the_reference() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in readme, f"the README does not point at {page.name}"
