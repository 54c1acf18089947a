"""Readers for the deployment files: YAML manifests, the Dockerfile, .dockerignore.

No Docker engine or cluster is needed: the files are parsed and their promises
checked as data (deploy/DEPLOYMENT.md says what they promise).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
GUIDE = DEPLOY / "DEPLOYMENT.md"
# Owned and tested elsewhere (the monitoring files).
NOT_OURS = (DEPLOY / "prometheus", DEPLOY / "grafana")


def our_yaml_files() -> list[Path]:
    found = sorted({*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")})
    return [p for p in found if not any(p.is_relative_to(d) for d in NOT_OURS)]


@cache
def documents(path: Path) -> tuple[Any, ...]:
    with path.open(encoding="utf-8") as fh:
        return tuple(doc for doc in yaml.safe_load_all(fh) if doc is not None)


def k8s_object(filename: str, kind: str) -> dict[str, Any]:
    matches = [d for d in documents(K8S / filename) if d.get("kind") == kind]
    assert len(matches) == 1, f"{filename}: expected one {kind}, found {len(matches)}"
    found: dict[str, Any] = matches[0]
    return found


def compose() -> dict[str, Any]:
    (doc,) = documents(COMPOSE)
    assert isinstance(doc, dict)
    return doc


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def dockerfile_instructions(text: str | None = None) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    text = DOCKERFILE.read_text(encoding="utf-8") if text is None else text
    out: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
    return out


def dockerfile_stages() -> list[Stage]:
    instructions = dockerfile_instructions()
    args: dict[str, str] = {}
    for ins in instructions:
        if ins.keyword == "FROM":
            break
        if ins.keyword == "ARG" and "=" in ins.args:
            arg, _, value = ins.args.partition("=")
            args[arg.strip()] = value.strip()
    stages: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            parts = ins.args.split()
            base = re.sub(
                r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], parts[0]
            )
            alias = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base, alias))
        elif stages:
            stages[-1].instructions.append(ins)
    return stages


def env_of(stage: Stage) -> dict[str, str]:
    """ENV key=value pairs of a stage (values may be quoted)."""
    env: dict[str, str] = {}
    for ins in stage.all("ENV"):
        for token in shlex.split(ins.args):
            name, sep, value = token.partition("=")
            assert sep, f"Dockerfile line {ins.line}: use the ENV key=value form"
            env[name] = value
    return env


def exec_form(ins: Instruction) -> list[str]:
    """The JSON array of an exec-form ENTRYPOINT/CMD (or HEALTHCHECK's CMD)."""
    text = ins.args
    if ins.keyword == "HEALTHCHECK":
        text = text[text.index("CMD ") + len("CMD ") :]
    value = json.loads(text)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def dockerignore_excludes(path: str, patterns: list[str] | None = None) -> bool:
    """Whether the build context leaves `path` out: Docker's rules (moby/patternmatcher).

    Patterns apply in order, the last match wins, `!` re-includes, and a pattern also
    matches every file below a directory it matches.
    """
    if patterns is None:
        lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        patterns = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _pattern_regex(pattern.lstrip("!").strip("/"))
        if any(regex.fullmatch(p) for p in prefixes):
            excluded = not negate
    return excluded


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)
