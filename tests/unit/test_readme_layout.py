"""The README's Layout section names every module of src/rayft, one line each, and nothing else."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def layout_modules() -> list[str]:
    """Paths under src/rayft/ that the Layout block lists (packages end with '/')."""
    block = ROOT.joinpath("README.md").read_text().split("## Layout", 1)[1].split("```")[1]
    lines = block.splitlines()
    start = lines.index("src/rayft/")
    found, package = [], ""
    for line in lines[start + 1 :]:
        m = re.match(r"^( {2,4})(\S+)", line)
        if not m or not line.startswith("  "):
            break
        name = m.group(2)
        if len(m.group(1)) == 2:
            package = name if name.endswith("/") else ""
            found.append(name)
        else:
            found.append(package + name)
    return found


def test_layout_names_every_module_once_and_matches_the_tree():
    listed = layout_modules()
    assert len(listed) == len(set(listed)), "a module is listed twice"
    src = ROOT / "src" / "rayft"
    modules = {str(p.relative_to(src)) for p in src.rglob("*") if p.suffix in (".py", ".json") and p.name != "__init__.py"}
    packages = {str(p.relative_to(src)) + "/" for p in src.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    # a one-module package may be written on one line (nccl/doctor.py)
    listed_modules = {n for n in listed if not n.endswith("/")}
    listed_packages = {n for n in listed if n.endswith("/")} | {n.split("/")[0] + "/" for n in listed_modules if "/" in n}
    assert listed_modules == modules
    assert listed_packages == packages
