"""Where a watched script runs: a mirror of the user's directory whose writes never reach the
user's files (nanoGPT reads configurator.py and data/ relative to where it starts)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from rankwise.tools.watch import workdir


@pytest.fixture
def user(tmp_path):
    """A user's directory: a config, a large data file, a hidden directory, rankwise's runs/."""
    home = tmp_path / "project"
    (home / "data").mkdir(parents=True)
    (home / "configurator.py").write_text("lr = 1\n")
    (home / "data" / "train.bin").write_bytes(b"\0" * 4096)
    (home / ".git").mkdir()
    (home / ".git" / "HEAD").write_text("ref\n")
    (home / "runs" / "verify-1").mkdir(parents=True)
    (home / "out").mkdir()
    (home / "out" / "ckpt.pt").write_bytes(b"precious" * 1000)
    return home


@pytest.mark.unit
def test_the_mirror_copies_small_files_links_large_ones_and_leaves_out_hidden_and_runs(
    user, monkeypatch
):
    monkeypatch.setattr(workdir, "COPY_BYTES", 1024)
    scratch = user / "runs" / "verify-1" / "candidate" / "scratch"
    scratch.mkdir(parents=True)
    counts = workdir.mirror(user, scratch, leave_out=(user / "runs",))
    assert (scratch / "configurator.py").read_text() == "lr = 1\n"
    assert not (scratch / "configurator.py").is_symlink()
    assert (scratch / "data" / "train.bin").is_symlink() and (scratch / "data").is_dir()
    assert not (scratch / "data").is_symlink()  # (a file the script creates there stays here)
    assert not (scratch / ".git").exists() and not (scratch / "runs").exists()
    assert counts == {"copied": 1, "linked": 2, "left_out": 0}


@pytest.mark.multiproc
def test_a_run_cannot_overwrite_a_linked_file_by_open_os_open_or_torch_save(user, monkeypatch):
    """In a real process, as a rank runs: the audit hook and the watched torch.save replace the
    link with the scratch's own file; the user's files keep their bytes."""
    monkeypatch.setattr(workdir, "COPY_BYTES", 1024)
    (user / "data" / "other.bin").write_bytes(b"x" * 2048)
    scratch = user.parent / "scratch"
    scratch.mkdir()
    workdir.mirror(user, scratch)
    script = textwrap.dedent(
        """
        import os, torch
        from rankwise.tools.watch import workdir
        from rankwise.tools.watch.saves import SaveWatch
        workdir.guard()
        SaveWatch(lambda: 0).install()
        torch.save({"w": torch.zeros(2)}, "out/ckpt.pt")
        with open("data/train.bin", "ab") as f:
            f.write(b"more")
        os.close(os.open("data/other.bin", os.O_WRONLY | os.O_CREAT))
        print(os.path.getsize("data/train.bin"))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=scratch,
        env={**os.environ, workdir.ORIGIN: str(user.resolve())},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(4096 + 4)  # (appended to a copy of the linked file)
    assert (user / "out" / "ckpt.pt").read_bytes() == b"precious" * 1000
    assert (user / "data" / "train.bin").read_bytes() == b"\0" * 4096
    assert (user / "data" / "other.bin").read_bytes() == b"x" * 2048
    assert not (scratch / "out" / "ckpt.pt").is_symlink()
    assert not (scratch / "data" / "train.bin").is_symlink()


@pytest.mark.unit
def test_a_directory_larger_than_the_cap_is_mirrored_up_to_it_and_says_so(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(workdir, "MAX_ENTRIES", 3)
    home = tmp_path / "home"
    home.mkdir()
    for name in "abcde":
        (home / name).write_text(name)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    counts = workdir.mirror(home, scratch)
    assert counts["copied"] == 3 and counts["left_out"] == 2
    assert "more than 3 files" in caplog.text
