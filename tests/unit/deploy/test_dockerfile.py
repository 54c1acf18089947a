"""The Dockerfile and .dockerignore keep the promises of deploy/DEPLOYMENT.md."""

from __future__ import annotations

import posixpath
import re

import pytest

from tests.unit.deploy.files import (
    DOCKERFILE,
    ROOT,
    Stage,
    dockerfile_instructions,
    dockerfile_stages,
    dockerignore_excludes,
    env_of,
    exec_form,
)

SECRET_NAMES = {
    "TAOTOKEN_API_KEY",
    "TOKENGATE_API_KEY",
    "TOKENGATE_ADMIN_KEY",
    "TOKENGATE_KEYS",
    "TOKENGATE_REDIS_URL",
    "TOKENGATE_REDIS__URL",
}
SECRET_SHAPES = re.compile(r"\b(sk|tg|tk)-[A-Za-z0-9_-]{8,}|bearer\s+\w", re.IGNORECASE)


@pytest.fixture(scope="module")
def final() -> Stage:
    return dockerfile_stages()[-1]


def test_multi_stage_from_python_slim() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2
    assert [s.base for s in stages] == ["python:3.11-slim"] * len(stages)
    builder = stages[0]
    assert builder.name == "builder"
    assert any("pip wheel" in i.args for i in builder.all("RUN")), "builder must build the wheel"


def test_final_stage_installs_only_the_wheel_from_the_builder(final: Stage) -> None:
    installs = [i.args for i in final.all("RUN") if "pip install" in i.args]
    assert len(installs) == 1, installs
    (install,) = installs
    assert "from=builder" in install
    assert "--no-index" in install, "runtime deps must come from the builder's wheels"
    assert re.search(r"/wheels/tokengate-\*\.whl(\s|$)", install), install
    assert "[dev]" not in DOCKERFILE.read_text(), "no dev extras in the image"
    assert " -e " not in install and "--editable" not in install
    text = " ".join(i.args for i in final.instructions)
    for tool in ("gcc", "build-essential", "curl"):
        assert tool not in text, f"{tool} has no place in the runtime stage"


def test_only_build_inputs_are_copied_from_the_context() -> None:
    allowed = {
        "pyproject.toml",
        "setup.py",
        "README.md*",
        "app",
        "config/config.toml",
        "config/settings.json",
    }
    for stage in dockerfile_stages():
        for ins in stage.all("COPY"):
            words = [w for w in ins.args.split() if not w.startswith("--")]
            if "--from=" in ins.args:
                continue
            sources = {w.rstrip("/") for w in words[:-1]}
            assert sources <= allowed, f"line {ins.line} copies {sources - allowed}"


def test_runs_as_a_non_root_user(final: Stage) -> None:
    users = final.all("USER")
    assert users, "the final stage must set USER"
    user = users[-1].args.split(":")[0]
    assert user not in {"root", "0"}
    assert user.isdigit(), "numeric uid, so Kubernetes runAsNonRoot can verify it"
    last_user = users[-1].line
    entrypoint = final.all("ENTRYPOINT")[-1].line
    assert last_user < entrypoint
    created = [i.args for i in final.all("RUN") if "useradd" in i.args]
    assert created and f"--uid {user}" in created[0]


def test_healthcheck_probes_health_with_python(final: Stage) -> None:
    (check,) = final.all("HEALTHCHECK")
    argv = exec_form(check)
    assert argv[:2] == ["python", "-c"], "slim has no curl"
    code = argv[2]
    compile(code, "<healthcheck>", "exec")
    assert "urllib" in code and "/health'" in code
    assert "TOKENGATE_PORT" in code, "the probe must follow a changed port"


def test_entrypoint_is_tokengate_serve(final: Stage) -> None:
    (entrypoint,) = final.all("ENTRYPOINT")
    assert exec_form(entrypoint) == ["tokengate", "serve"], "exec form, so SIGTERM reaches it"
    assert not final.all("CMD"), "host/port/workers come from the environment, not CMD flags"


def test_container_defaults(final: Stage) -> None:
    env = env_of(final)
    expected = {
        "TOKENGATE_HOST": "0.0.0.0",
        "TOKENGATE_PORT": "8080",
        "TOKENGATE_WORKERS": "1",
        "TOKENGATE_CONFIG": "/app/config/config.toml",
        "TOKENGATE_SETTINGS": "/app/config/settings.json",
        "TOKENGATE_LOGGING__OUTPUT": "stdout",
        "TOKENGATE_DATABASE__PATH": "/app/var/tokengate.sqlite3",
    }
    assert {k: env.get(k) for k in expected} == expected
    assert [i.args for i in final.all("EXPOSE")] == [env["TOKENGATE_PORT"]]


def test_seed_config_is_copied_where_the_cli_looks(final: Stage) -> None:
    env = env_of(final)
    copies = [i.args.split() for i in final.all("COPY") if "config/" in i.args]
    assert len(copies) == 1
    *sources, dest = copies[0]
    for var in ("TOKENGATE_CONFIG", "TOKENGATE_SETTINGS"):
        assert posixpath.dirname(env[var]) + "/" == dest
        assert f"config/{posixpath.basename(env[var])}" in sources
        assert (ROOT / "config" / posixpath.basename(env[var])).is_file()


def test_database_directory_is_owned_by_the_app_user(final: Stage) -> None:
    ledger_dir = posixpath.dirname(env_of(final)["TOKENGATE_DATABASE__PATH"])
    uid = final.all("USER")[-1].args.split(":")[0]
    runs = [i.args for i in final.all("RUN")]
    assert any("mkdir -p" in r and ledger_dir in r for r in runs)
    assert any(re.search(rf"chown {uid}(:\d+)? {re.escape(ledger_dir)}\b", r) for r in runs)


def test_no_secret_is_baked_in() -> None:
    for ins in dockerfile_instructions():
        if ins.keyword in {"ARG", "ENV"}:
            names = {w.split("=")[0] for w in ins.args.split() if "=" in w or ins.keyword == "ARG"}
            assert not names & SECRET_NAMES, f"line {ins.line} bakes {names & SECRET_NAMES}"
            for name in names:
                assert not re.search(r"KEY|SECRET|PASSWORD", name), f"line {ins.line}: {name}"
    text = DOCKERFILE.read_text()
    assert not SECRET_SHAPES.search(text)


@pytest.mark.parametrize(
    "path",
    [
        ".git/HEAD",
        ".venv/bin/python",
        ".env",
        "tests/conftest.py",
        "var/tokengate.sqlite3",
        "deploy/compose.yaml",
        "app/__pycache__/cli.cpython-311.pyc",
        "tokengate.egg-info/PKG-INFO",
    ],
)
def test_dockerignore_keeps_out(path: str) -> None:
    assert dockerignore_excludes(path)


@pytest.mark.parametrize(
    "path",
    [
        "pyproject.toml",
        "setup.py",
        "README.md",
        "app/commands/cli.py",
        "app/limits/token_bucket.lua",
        "config/config.toml",
        "config/settings.json",
    ],
)
def test_dockerignore_keeps_build_inputs(path: str) -> None:
    assert not dockerignore_excludes(path)


def test_dockerignore_matcher_follows_docker_rules() -> None:
    patterns = ["*", "!app/", "**/__pycache__", "!docs/*.md"]
    assert dockerignore_excludes("x.txt", patterns)
    assert not dockerignore_excludes("app/a/b.py", patterns)
    assert dockerignore_excludes("app/a/__pycache__/b.pyc", patterns)
    assert not dockerignore_excludes("docs/x.md", patterns)
    assert dockerignore_excludes("docs/x/y.md", patterns)
    assert not dockerignore_excludes("keep.txt", ["*.md"])
