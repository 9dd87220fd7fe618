"""A non-editable install gets every module: the wheel built from pyproject.toml holds every .py file of
the packages (sub-packages are listed there by name, and one left out is silently left out of the
wheel) and their package data."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("data", "hints", "model", "train")
PACKAGE_DATA = ("hints/index/build_rates.json",)  # pyproject.toml's [tool.setuptools.package-data]
NOT_SOURCE = ("__pycache__", "*.pyc", "*.nbi", "*.nbc", "local_corpus", "fineweb10B", "fineweb100B")


def test_the_wheel_holds_every_module_and_its_data(tmp_path):
    src = tmp_path / "src"  # a copy: building writes build/ and *.egg-info beside the sources
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                        "-w", str(tmp_path / "wheel"), str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    wheels = list((tmp_path / "wheel").glob("*.whl"))
    assert len(wheels) == 1
    held = set(zipfile.ZipFile(wheels[0]).namelist())
    want = {str(f.relative_to(src)) for pkg in PACKAGES for f in (src / pkg).rglob("*.py")} | set(PACKAGE_DATA)
    assert any(f.startswith("hints/index/") for f in want)  # the sub-packages are there to be missed
    missing = sorted(want - held)
    assert not missing, f"the wheel lacks {missing} (list every sub-package in pyproject.toml)"
