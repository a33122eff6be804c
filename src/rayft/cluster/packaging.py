"""What `rayft submit` uploads as the job's ``working_dir``: which files go, how many, how large, and the zip.

The folder is walked once (:func:`scan`); a path is left out when, in this order:

1. it matches :data:`ALWAYS_EXCLUDED` (runs, virtual environments, git metadata, caches);
2. a ``.gitignore``, ``.rayignore`` or ``.rayftignore`` in its folder or a folder above it (up to the
   root) ignores it: gitignore syntax, patterns relative to the file's folder, ``!`` re-including
   what the same file ignored. A path any one of them ignores stays out, as Ray reads .gitignore
   and .rayignore (``ray._private.runtime_env.packaging``);
3. it matches :data:`SECRET_PATTERNS` (``.env*``, keys, cloud credentials, Terraform state): these
   are withheld whatever the ignore files say, and listed in :attr:`Package.withheld` so the user
   sees them. A symbolic link is also withheld when its target's path matches.

Patterns are read with the gitwildmatch implementation Ray itself uses for .gitignore and
``excludes`` (``pathspec``, vendored in Ray), so they mean what they mean to Ray and to git.

:func:`write_zip` writes exactly :attr:`Package.files` into a zip (sorted, fixed timestamps: the
same files give the same bytes, so Ray's content-addressed upload is skipped when unchanged); Ray
uploads a local zip ``working_dir`` as it is, without walking or filtering it again.
"""

from __future__ import annotations

import os
import shutil
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ray._private.thirdparty.pathspec import PathSpec

#: never uploaded: run outputs, environments, git metadata, caches (folders at any depth)
ALWAYS_EXCLUDED = ["runs/", ".venv/", "venv/", ".gpu/", ".git/", "__pycache__/", "*.egg-info/", ".pytest_cache/", ".rayft/"]
#: never uploaded, whatever .gitignore / .rayignore / .rayftignore say
SECRET_PATTERNS = [
    ".env*", "*.pem", "*.key", "*.p12", "*.pfx", "id_*", ".aws/", ".ssh/", ".kube/", ".netrc", ".git-credentials", ".pypirc",
    "credentials*", "*.tfstate", "*.tfvars",
]  # fmt: skip
#: ignore files read in every folder (gitignore syntax)
IGNORE_FILES = (".gitignore", ".rayignore", ".rayftignore")
#: the largest working_dir `rayft submit` uploads without --yes (bytes, files' sizes summed)
MAX_UPLOAD_BYTES = 100_000_000

_FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold


@dataclass(frozen=True)
class Package:
    """One working_dir, scanned.

    Attributes:
        root: the folder (absolute).
        files: POSIX paths relative to ``root`` of every file that goes, sorted.
        total_bytes: their sizes summed (what the cluster unpacks).
        withheld: paths (relative; folders end with ``/``) left out only because they match
            :data:`SECRET_PATTERNS`.
    """

    root: Path
    files: tuple[str, ...]
    total_bytes: int
    withheld: tuple[str, ...]


def _spec(lines: list[str]) -> PathSpec:
    return PathSpec.from_lines("gitwildmatch", lines)


_ALWAYS = _spec(ALWAYS_EXCLUDED)
_SECRETS = _spec(SECRET_PATTERNS)


def _ignore_specs(folder: Path) -> list[PathSpec]:
    """The specs of ``folder``'s ignore files.

    Raises:
        OSError: an ignore file that cannot be read.
        ValueError: a pattern gitwildmatch refuses, naming the file.
    """
    out = []
    for name in IGNORE_FILES:
        f = folder / name
        if f.is_file():
            try:
                out.append(_spec(f.read_text(encoding="utf-8", errors="replace").splitlines()))
            except ValueError as e:  # pathspec's GitWildMatchPatternError is a ValueError
                raise ValueError(f"{f}: {e}") from None
    return out


def scan(root: Path) -> Package:
    """Walk ``root`` and decide every path (see the module's rules).

    Raises:
        OSError: a folder or ignore file that cannot be read.
        ValueError: an ignore file with a pattern gitwildmatch refuses.
    """
    root = root.resolve()
    files: list[str] = []
    withheld: list[str] = []
    total = 0
    # (folder, its ignore files' specs) from the root down to the folder being walked
    stack: list[tuple[Path, list[tuple[Path, PathSpec]], frozenset[Path]]] = [(root, [], frozenset())]
    while stack:
        folder, inherited, ancestors = stack.pop()
        real = folder.resolve()
        if real in ancestors:
            continue  # a symbolic link back into its own ancestry
        ancestors = ancestors | {real}
        specs = inherited + [(folder, s) for s in _ignore_specs(folder)]
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            path = Path(entry.path)
            is_dir = entry.is_dir()  # follows symbolic links, as Ray's walk does
            rel = path.relative_to(root).as_posix()
            key = rel + "/" if is_dir else rel
            if _ALWAYS.match_file(key):
                continue
            if any(s.match_file(path.relative_to(base).as_posix() + ("/" if is_dir else "")) for base, s in specs):
                continue
            if _SECRETS.match_file(key) or (entry.is_symlink() and _SECRETS.match_file(os.path.realpath(path).lstrip("/"))):
                withheld.append(key)
                continue
            if is_dir:
                stack.append((path, specs, ancestors))
            elif entry.is_file():  # a regular file, or a link to one; sockets, FIFOs and broken links stay out
                files.append(rel)
                total += entry.stat().st_size
    return Package(root, tuple(sorted(files)), total, tuple(sorted(withheld)))


def write_zip(pkg: Package, dest: Path) -> Path:
    """Write ``pkg.files`` into the zip ``dest`` (deflated, sorted, timestamps fixed; file modes kept).

    Raises:
        OSError: a file that cannot be read, or ``dest`` that cannot be written.
    """
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for rel in pkg.files:
            src = pkg.root / rel
            info = zipfile.ZipInfo(rel, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (stat.S_IMODE(src.stat().st_mode) | stat.S_IFREG) << 16
            with src.open("rb") as f, zf.open(info, "w") as out:
                shutil.copyfileobj(f, out, 1 << 20)
    return dest


def format_size(n: int) -> str:
    """``12.3 kB``, ``4.5 MB``, ``100 MB``, ``1.2 GB`` (decimal units, one decimal unless it is 0)."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} B"
