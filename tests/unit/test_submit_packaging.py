"""What `rayft submit` uploads: ignore files, secrets withheld whatever they say, the 100 MB limit, --dry-run.

The job on a real cluster (what Ray unpacked on each node) is checked in
tests/integration/test_submit.py::test_submit_uploads_exactly_the_listed_files_and_no_secret.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rayft.cli import app
from rayft.cluster import packaging as P
from rayft.cluster import submit as sub

CONFIG = "data:\n  train_files: [data/d.jsonl]\n"


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


@pytest.fixture
def project(tmp_path) -> Path:
    """A folder with no pyproject.toml above it (so it is the working_dir), secrets beside the config."""
    root = tree(
        tmp_path / "proj",
        {
            "job.yaml": CONFIG,
            "train.py": "print('hi')\n",
            "data/d.jsonl": "{}\n",
            "local.txt": "kept: the sub folder's .gitignore only covers its own folder\n",
            # secrets, every pattern
            ".env": "AWS_ACCESS_KEY_ID=AKIAEXAMPLE\nAWS_SECRET_ACCESS_KEY=not-a-real-secret\n",
            ".env.production": "X=1\n",
            "id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\n",
            "keys/id_ed25519.pub": "ssh-ed25519 AAAA\n",
            "tls/server.pem": "pem\n",
            "tls/server.key": "key\n",
            ".aws/credentials": "[default]\n",
            ".netrc": "machine x login y password z\n",
            "credentials.json": "{}\n",
            "infra/terraform.tfstate": "{}\n",
            "infra/prod.tfvars": 'db_password = "x"\n',
            ".ssh/config": "Host *\n",
            ".kube/config": "apiVersion: v1\n",
            ".git-credentials": "https://u:t@example.invalid\n",
            ".pypirc": "[pypi]\n",
            "certs/client.p12": "p12\n",
            "certs/client.pfx": "pfx\n",
            "sub/.env.local": "Y=2\n",
            # ignore files: a negation cannot bring a secret back
            ".gitignore": "gitignored.txt\nlogs/\n!.env\n!id_rsa\n",
            ".rayftignore": "notes.md\nbig/\n",
            ".rayignore": "rayignored.txt\n",
            "sub/.gitignore": "local.txt\n",
            "sub/local.txt": "ignored by sub/.gitignore\n",
            "sub/code.py": "x = 1\n",
            "gitignored.txt": "x\n",
            "logs/a.log": "x\n",
            "notes.md": "x\n",
            "big/blob.bin": "x\n",
            "rayignored.txt": "x\n",
            # always excluded
            "runs/r1/rayft_metrics.jsonl": "{}\n",
            ".venv/bin/python": "",
            ".git/HEAD": "ref\n",
            "__pycache__/train.cpython-311.pyc": "",
        },
    )
    outside = tree(tmp_path / "home", {".aws/credentials": "[default]\naws_secret_access_key=zzz\n"})
    os.symlink(outside / ".aws" / "credentials", root / "settings.ini")  # an innocent name for a secret
    return root


KEPT = (".gitignore", ".rayftignore", ".rayignore", "data/d.jsonl", "job.yaml", "local.txt", "sub/.gitignore", "sub/code.py", "train.py")
WITHHELD = (
    ".aws/",
    ".env",
    ".env.production",
    ".git-credentials",
    ".kube/",
    ".netrc",
    ".pypirc",
    ".ssh/",
    "certs/client.p12",
    "certs/client.pfx",
    "credentials.json",
    "id_rsa",
    "infra/prod.tfvars",
    "infra/terraform.tfstate",
    "keys/id_ed25519.pub",
    "settings.ini",
    "sub/.env.local",
    "tls/server.key",
    "tls/server.pem",
)


def test_scan_honours_the_ignore_files_and_withholds_every_secret(project):
    pkg = P.scan(project)
    assert pkg.root == project.resolve()
    assert pkg.files == KEPT
    assert pkg.withheld == WITHHELD
    assert pkg.total_bytes == sum((project / f).stat().st_size for f in KEPT)


def test_the_zip_holds_exactly_the_listed_files_and_the_same_files_give_the_same_bytes(project, tmp_path):
    pkg = P.scan(project)
    a = P.write_zip(pkg, tmp_path / "a.zip")
    with zipfile.ZipFile(a) as z:
        assert tuple(z.namelist()) == KEPT
        assert z.read("train.py") == b"print('hi')\n"
    (project / "train.py").touch()  # a new mtime, same content: same package, so Ray skips the upload
    b = P.write_zip(P.scan(project), tmp_path / "b.zip")
    assert hashlib.sha1(a.read_bytes()).digest() == hashlib.sha1(b.read_bytes()).digest()


def test_a_config_the_package_leaves_out_is_refused(project):
    (project / "credentials.yaml").write_text(CONFIG)
    with pytest.raises(sub.SubmitError) as e:
        sub.package(project / "credentials.yaml")
    assert str(e.value) == (
        f"{project / 'credentials.yaml'} would not be uploaded with the working dir {project.resolve()}: it matches rayft's "
        "secret patterns; rename it or change the ignore file"
    )
    (project / "notes.md").write_text(CONFIG)
    with pytest.raises(sub.SubmitError, match=r"an ignore file \(.gitignore, .rayignore, .rayftignore\) or rayft's default"):
        sub.package(project / "notes.md")


def big(project: Path, size: int) -> None:
    with (project / "weights.bin").open("wb") as f:
        f.truncate(size)  # sparse: the size without the disk


def test_over_100_mb_is_refused_without_yes_before_the_cluster_is_contacted(project):
    base = P.scan(project).total_bytes
    big(project, 100_000_000 - base)
    pkg, _ = sub.package(project / "job.yaml")
    assert pkg.total_bytes == 100_000_000
    sub.check_size(pkg, yes=False)  # exactly the limit goes
    big(project, 100_000_001 - base)
    with pytest.raises(sub.SubmitError, match="more than the 100 MB"):
        sub.check_size(sub.package(project / "job.yaml")[0], yes=False)
    big(project, 150_000_000 - base)
    pkg, _ = sub.package(project / "job.yaml")
    with pytest.raises(sub.SubmitError) as e:
        sub.check_size(pkg, yes=False)
    assert str(e.value) == (
        f"the working dir {project.resolve()} holds 150 MB in 10 files, more than the 100 MB `rayft submit` uploads without "
        "--yes: leave out what the job does not need with a .rayftignore (gitignore syntax; `rayft submit --dry-run` lists "
        "every file), or pass --yes"
    )
    sub.check_size(pkg, yes=True)
    # the command: refused before any connection (nothing listens on port 1; reaching for it would say so)
    r = CliRunner().invoke(app, ["submit", str(project / "job.yaml"), "--address", "http://127.0.0.1:1"])
    assert r.exit_code == 1, r.output
    assert "holds 150 MB in 10 files, more than the 100 MB `rayft submit` uploads without --yes" in " ".join(r.stderr.split())
    assert "cannot reach" not in r.output and "submitting to" not in r.output


def test_dry_run_lists_exactly_what_would_go_and_submits_nothing(project, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # no cluster anywhere: a dry run needs none
    r = CliRunner().invoke(app, ["submit", str(project / "job.yaml"), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == list(KEPT)
    size = P.format_size(P.scan(project).total_bytes)
    assert r.stderr.splitlines() == [
        f"working_dir {project.resolve()}: 9 files, {size}; never uploaded (secret patterns): {', '.join(WITHHELD)}",
        "dry run: nothing submitted",
    ]
    big(project, 150_000_000)
    r = CliRunner().invoke(app, ["submit", str(project / "job.yaml"), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == sorted([*KEPT, "weights.bin"])
    err = " ".join(r.stderr.split())
    assert "10 files, 150 MB" in err and "submitting would fail: the working dir" in err and "dry run: nothing submitted" in err
