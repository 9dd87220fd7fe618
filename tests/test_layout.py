"""The repo's layout rules, checked on its source: data flows one way (data -> hints -> model ->
train -> train_gpt.py), `hints/` imports no torch, `model/` imports neither `hints/` nor `data/`,
nothing imports the entry point, no file edits sys.path, and nothing points outside the repo for
its design."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("data", "hints", "model", "train")


def python_files():
    files = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")]
    return files + sorted((REPO / "scripts").glob("*.py")) + sorted((REPO / "tests").glob("*.py")) + [REPO / "train_gpt.py"]


def imported_modules(path):
    """Top-level module names a file imports (absolute imports; relative ones stay in the package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package, forbidden", [
    ("data", {"hints", "model", "train", "train_gpt", "torch"}),
    ("hints", {"model", "train", "train_gpt", "torch"}),  # hints/exact.py may import torch lazily, in functions
    ("model", {"hints", "data", "train", "train_gpt"}),
    ("train", {"train_gpt"}),
])
def test_data_flows_one_way(package, forbidden):
    for path in (REPO / package).rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        top_level = set()
        for node in tree.body:  # module-level imports only: a lazy import inside a function is allowed
            if isinstance(node, ast.Import):
                top_level |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                top_level.add(node.module.split(".")[0])
        assert not top_level & forbidden, f"{path.relative_to(REPO)} imports {sorted(top_level & forbidden)}"


def test_nothing_imports_the_entry_point_or_edits_sys_path():
    for path in python_files():
        if path.name == "test_layout.py":
            continue
        assert "train_gpt" not in imported_modules(path), f"{path.relative_to(REPO)} imports train_gpt"
        text = path.read_text()
        assert "sys.path.insert" not in text and "sys.path[0]" not in text, f"{path.relative_to(REPO)} edits sys.path"


def test_the_design_is_cited_inside_the_repo():
    assert (REPO / "docs" / "design.md").is_file()
    for path in python_files() + [REPO / "README.md", REPO / "run.sh", REPO / "test.sh"]:
        if path.name == "test_layout.py":
            continue
        text = path.read_text()
        # the design the repo cites is its own docs/design.md (DESIGN.md was a file outside the repo)
        assert "DESIGN.md" not in text, f"{path.relative_to(REPO)} cites DESIGN.md, which the repo does not hold"
        assert "shared/" not in text, f"{path.relative_to(REPO)} points outside the repo"


COMMANDS = [["train_gpt.py"], ["-m", "hints"], ["-m", "hints", "build"], ["-m", "train.plan"], ["-m", "train.placement"],
            ["-m", "data.manifest"], ["-m", "data.local_corpus"], ["-m", "data.fineweb"], ["-m", "data.cached_fineweb10B"],
            ["scripts/ablate.py"], ["scripts/compare.py"], ["scripts/cpu_ab.py"], ["scripts/hints_ab.py"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help(command):
    env = dict(os.environ, PYTHONPATH=str(REPO))  # the checkout's packages, installed or not
    p = subprocess.run([sys.executable, *command, "--help"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and "usage:" in p.stdout, p.stderr[-2000:]
