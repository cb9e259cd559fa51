"""The local backend's Dockerfile parser, one construct per test (no sandbox needed)."""

from __future__ import annotations

import pytest
from slr_backend_local.dockerfile import UnsupportedDockerfile, parse

IMAGE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def _steps(tmp_path, text, build_args=None, image_env=IMAGE_ENV):
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    parsed = parse(path, build_args)
    return parsed, parsed.steps(image_env)


def _env(steps):
    env = {}
    for s in steps:
        if s.op == "ENV":
            env.update(kv.split("=", 1) for kv in s.args)
    return env


def test_env_path_expands_the_image_path(tmp_path):
    _, steps = _steps(tmp_path, "FROM img\nENV PATH=/opt/venv/bin:$PATH\n")
    assert _env(steps)["PATH"] == "/opt/venv/bin:/usr/local/bin:/usr/bin:/bin"


def test_braces_and_defaults(tmp_path):
    _, steps = _steps(
        tmp_path,
        "FROM img\nENV A=1\nENV B=${A}x C=${UNSET:-dflt} D=${A:-no} E=${A:+alt} F=${UNSET:+alt}\n",
    )
    env = _env(steps)
    assert (env["B"], env["C"], env["D"], env["E"], env["F"]) == ("1x", "dflt", "1", "alt", "")


def test_one_env_line_sees_the_values_from_before_it(tmp_path):
    # docker: within one ENV instruction, $abc is the value before the line
    _, steps = _steps(tmp_path, "FROM img\nENV abc=hello\nENV abc=bye def=$abc\n")
    env = _env(steps)
    assert (env["abc"], env["def"]) == ("bye", "hello")


def test_quotes_and_escapes(tmp_path):
    _, steps = _steps(
        tmp_path,
        "FROM img\nENV A=1\nENV S='$A' D=\"x $A y\" E=\\$A N=a\\ b\n",
    )
    env = _env(steps)
    assert (env["S"], env["D"], env["E"], env["N"]) == ("$A", "x 1 y", "$A", "a b")


def test_legacy_env_form_keeps_spaces_and_expands(tmp_path):
    _, steps = _steps(tmp_path, "FROM img\nENV GREETING hello $LANG world\n")
    assert _env(steps)["GREETING"] == "hello C.UTF-8 world"


def test_arg_default_build_arg_and_scope(tmp_path):
    text = (
        "ARG BASE=img:1\n"
        "FROM $BASE\n"
        "ARG DIR=/opt/app\n"
        "ARG VERSION\n"
        "ARG BASE\n"  # re-declared in the stage: takes the global value
        "WORKDIR $DIR/src\n"
        "ENV V=${VERSION:-none} B=$BASE\n"
        "RUN echo $DIR\n"
    )
    parsed, steps = _steps(tmp_path, text)
    assert parsed.base == "img:1"
    assert [s.args[0] for s in steps if s.op == "WORKDIR"] == ["/opt/app/src"]
    assert _env(steps) == {"V": "none", "B": "img:1"}
    run = next(s for s in steps if s.op == "RUN")
    # the shell expands a RUN: the ARGs are in its environment, not in the sandbox's
    assert run.args == ("/bin/sh", "-c", "echo $DIR")
    assert dict(run.env)["DIR"] == "/opt/app"

    parsed, steps = _steps(tmp_path, text, build_args={"BASE": "other:2", "VERSION": "3"})
    assert parsed.base == "other:2"
    assert _env(steps)["V"] == "3"


def test_an_arg_before_from_is_not_in_the_stage_unless_redeclared(tmp_path):
    _, steps = _steps(tmp_path, "ARG X=1\nFROM img\nENV Y=${X:-unset}\n")
    assert _env(steps)["Y"] == "unset"


def test_env_wins_over_an_arg_of_the_same_name(tmp_path):
    _, steps = _steps(tmp_path, "FROM img\nARG V=arg\nENV V=env\nENV W=$V\n")
    assert _env(steps)["W"] == "env"


def test_workdir_relative_and_copy_expanded(tmp_path):
    _, steps = _steps(
        tmp_path,
        "FROM img\nARG D=/srv\nWORKDIR $D\nWORKDIR sub\nCOPY --chown=1:1 a.txt ${D}/data/\n"
        'COPY ["b c.txt", "$D/x"]\n',
    )
    assert [s.args[0] for s in steps if s.op == "WORKDIR"] == ["/srv", "/srv/sub"]
    copies = [s.args for s in steps if s.op == "COPY"]
    assert copies == [("a.txt", "/srv/data/"), ("b c.txt", "/srv/x")]


def test_line_continuations_comments_and_blank_lines(tmp_path):
    text = (
        "FROM img\n"
        "RUN apt-get update && \\\n"
        "    # a comment inside the command is dropped\n"
        "\n"
        "    apt-get install -y \\\n"
        "      git\n"
        "ENV A=1 \\\n"
        "    B=2\n"
    )
    _, steps = _steps(tmp_path, text)
    run = next(s for s in steps if s.op == "RUN")
    assert run.args[-1] == "apt-get update && apt-get install -y git"
    assert run.line == 2
    assert _env(steps) == {"A": "1", "B": "2"}


def test_escape_directive(tmp_path):
    _, steps = _steps(tmp_path, "# escape=`\nFROM img\nENV A=1 `\n    B=c:\\dir\n")
    assert _env(steps) == {"A": "1", "B": "c:\\dir"}


def test_shell_and_exec_forms(tmp_path):
    _, steps = _steps(
        tmp_path,
        'FROM img\nRUN ["echo", "$HOME"]\nSHELL ["/bin/bash", "-eu", "-c"]\nRUN echo hi\n',
    )
    runs = [s.args for s in steps if s.op == "RUN"]
    assert runs == [("echo", "$HOME"), ("/bin/bash", "-eu", "-c", "echo hi")]


def test_no_effect_instructions_are_dropped(tmp_path):
    _, steps = _steps(
        tmp_path, 'FROM img\nLABEL a=b\nEXPOSE 80\nCMD ["x"]\nUSER app\nHEALTHCHECK NONE\n'
    )
    assert [(s.op, s.args) for s in steps] == [("USER", ("app",))]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("FROM img\nADD https://example.invalid/x.tgz /opt/\n", r"Dockerfile:2: ADD of a URL"),
        ("FROM a AS b\nFROM c\nCOPY --from=b /x /y\n", r"Dockerfile:2: a second FROM"),
        ("FROM img\nCOPY --from=other /x /y\n", r"Dockerfile:2: COPY --from"),
        ("FROM img\nRUN <<EOF\necho\nEOF\n", r"Dockerfile:2: heredocs"),
        ("FROM img\nENV A=${B/x/y}\n", r"Dockerfile:2: unsupported substitution"),
        ("FROM img\nFROBNICATE x\n", r"Dockerfile:2: unknown instruction FROBNICATE"),
        ("RUN true\n", r"Dockerfile:1: RUN before FROM"),
        ("FROM img\nENV A='x\n", r"Dockerfile:2: unterminated ' quote"),
        ("FROM img\nRUN --mount=type=cache,target=/c true\n", r"Dockerfile:2: RUN --mount"),
    ],
)
def test_what_needs_a_real_build_names_the_line(tmp_path, text, match):
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    with pytest.raises(UnsupportedDockerfile, match=match):
        parse(path).steps(IMAGE_ENV)


def test_shell_arithmetic_is_not_a_heredoc(tmp_path):
    _, steps = _steps(tmp_path, "FROM img\nRUN echo $((1<<2))\n")
    assert steps[0].args[-1] == "echo $((1<<2))"
