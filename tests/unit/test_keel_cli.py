"""The ``keel`` command: every subcommand parses, and operator mistakes end in one
``keel: ...`` line and exit 1, never a traceback; ``keel down`` is idempotent."""
from __future__ import annotations

import pytest

from keel.deploy.keel import build_parser, main, parse_args


def noop_spec(tmp_path, run_dir) -> str:
    path = tmp_path / "spec.toml"
    path.write_text(f'[cluster]\nname = "t"\nrun_dir = "{run_dir}"\n[models.m]\nbuiltin = "noop"\n')
    return str(path)


@pytest.mark.parametrize("argv", [["serve", "worker", "--config", "{}"], ["bench", "core", "--quick"],
                                  ["experiment", "parm-tail", "--quick"], ["demo", "--no-parm"]])
def test_subcommands_parse(argv):
    assert callable(parse_args(argv).func)


def test_rollout_profiles_a_serf_model_by_default_and_no_profile_keeps_it_held():
    assert parse_args(["model", "rollout", "spec.toml", "m"]).no_profile is False
    assert parse_args(["model", "rollout", "spec.toml", "m", "--no-profile"]).no_profile is True
    assert parse_args(["model", "rollback", "spec.toml", "m", "--no-profile"]).no_profile is True


def test_serve_roles_come_from_the_role_table():
    from keel.common.roles import ROLES

    with pytest.raises(SystemExit):
        parse_args(["serve", "no-such-role", "--config", "{}"])
    for role in ROLES:
        assert parse_args(["serve", role, "--config", "{}"]).role == role


def one_line_error(capsys, argv, words: str) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("keel: ") and words in err and "Traceback" not in err, err


def test_up_on_a_binary_file(tmp_path, capsys):
    path = tmp_path / "spec.toml"
    path.write_bytes(bytes(range(256)) * 4)
    one_line_error(capsys, ["up", str(path)], "not a text file")


def test_up_on_a_directory(tmp_path, capsys):
    one_line_error(capsys, ["up", str(tmp_path)], "is a directory")


def test_up_with_an_unwritable_run_dir(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    one_line_error(capsys, ["up", noop_spec(tmp_path, blocker / "run")], "cannot write there")


def test_down_of_a_spec_never_brought_up_succeeds(tmp_path, capsys):
    spec = noop_spec(tmp_path, tmp_path / "run")
    for _ in range(2):
        assert main(["down", spec]) == 0
        assert "nothing was brought up" in capsys.readouterr().out


def test_up_with_a_keys_folder_that_has_no_operator_keypair(tmp_path, capsys):
    from keel.common import curve

    keys = tmp_path / "keys"
    curve.generate(keys, ("alice",))
    (keys / "operator.key_secret").unlink(missing_ok=True)
    path = tmp_path / "spec.toml"
    path.write_text(f'[cluster]\nname = "t"\nrun_dir = "{tmp_path / "run"}"\ncurve_keys = "{keys}"\n'
                    '[models.m]\nbuiltin = "noop"\n')
    one_line_error(capsys, ["up", str(path)], "operator.key_secret is missing")
    assert not (tmp_path / "run").exists()  # refused before anything was rendered


def test_up_with_a_port_in_use_says_which_in_one_line(tmp_path, capsys):
    import socket

    from keel.deploy.local import free_port_block

    base = free_port_block()
    blocker = socket.create_server(("127.0.0.1", base))  # the frontend's client endpoint
    try:
        path = tmp_path / "spec.toml"
        path.write_text(f'[cluster]\nname = "t"\nrun_dir = "{tmp_path / "run"}"\nbase_port = {base}\n'
                        '[models.m]\nbuiltin = "noop"\n')
        one_line_error(capsys, ["up", str(path)], f"port {base} on 127.0.0.1 (frontend client_endpoint) is in use")
    finally:
        blocker.close()
        started = (tmp_path / "run" / "supervisord.pid").exists()
        if started:  # the check failed: stop what it started rather than leave it running
            main(["down", str(path)])
    assert not started  # nothing was started


def container_store(tmp_path):
    """A store with one Python container model (no torch needed to write it)."""
    from keel.common.modelstore import ModelStore

    (tmp_path / "echo.py").write_text("class Echo:\n    def predict_batch(self, inputs):\n        return inputs\n")
    (tmp_path / "artifact.bin").write_bytes(b"weights")
    store = ModelStore(tmp_path / "store")
    manifest = store.add("echo", tmp_path / "artifact.bin", "python", entry=f"{tmp_path / 'echo.py'}:Echo",
                         input_shape=[2], output_size=2)
    path = tmp_path / "spec.toml"
    path.write_text(f'[cluster]\nname = "t"\nrun_dir = "{tmp_path / "run"}"\nstore = "{store.root}"\n[models.echo]\n')
    return store.folder(manifest), str(path)


def test_up_with_a_corrupted_store_file_ends_in_one_line(tmp_path, capsys):
    folder, spec = container_store(tmp_path)
    (folder / "artifact").write_bytes(b"tampered")
    one_line_error(capsys, ["up", spec], "sha256 of artifact")
    assert not (tmp_path / "run" / "supervisord.pid").exists()
    (folder / "manifest.json").write_text("{not json")
    one_line_error(capsys, ["up", spec], "manifest.json is unreadable")


def test_status_into_a_closed_pipe_is_quiet(tmp_path):
    """`keel status SPEC | head -0`: the reader is gone before keel writes."""
    import subprocess
    import sys

    spec = noop_spec(tmp_path, tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from keel.deploy.keel import main; sys.exit(main())",
                             "status", spec], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    try:
        err = proc.stderr.read().decode()
        code = proc.wait(60)
    finally:
        proc.kill()
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert code in (0, 3)  # quiet either way: 3 is status's own answer (supervisord is not running)


def _subparsers(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def test_help_texts_name_no_issue_numbers():
    import re

    for top in ("experiment", "bench", "chaos", "model", "up", "keys"):
        parser = dict(_subparsers(build_parser([top])))[top]
        texts = [parser.format_help()] + [p.format_help() for _, p in _subparsers(parser)]
        for text in texts:
            assert not re.search(r"\bissues? ?#?\d+|#\d+\b", text), text
