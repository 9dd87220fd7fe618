"""Numba's on-disk cache of the hint kernels, keyed to the source of all of hints/.

Numba keys a cached kernel to its own file (a hash of it): an edit there compiles it again. But a
kernel also compiles in what it reads from other modules, their constants and the functions it
inlines (index/results.py's purity_kinds inlines kinds.py's kind_of and its bucket edges; every
kernel, numba_ops.py's intrinsics), and an edit there left the cached kernel as it was: a changed
purity edge in kinds.py went unseen by a kernel cached from index/results.py, and a test passed
against the old code.

So every kernel defined under hints/ is cached with, as its source stamp, one hash of every .py
file under hints/ (`source_stamp`): an edit anywhere in the package compiles its kernels again, on
first use, and nothing has to be cleared by hand. Where the cache lives stays Numba's choice, as
for any other package: NUMBA_CACHE_DIR when the user sets it, else the package's own __pycache__
folders, else the user-wide cache; entries of old sources are overwritten in place. hints/__init__.py
calls `register()` before any kernel is defined (a kernel takes its cache locator when decorated).

The mechanism is Numba's list of cache locators (numba.core.caching.CacheImpl._locator_classes):
three are put in front of it, subclasses of Numba's file-backed locators that answer only for
files under this package and stamp them with its hash. A user's NUMBA_CACHE_LOCATOR_CLASSES
replaces that list, and with it this keying.
"""
import hashlib
import os

from numba.core import caching

PACKAGE_DIR = os.path.dirname(os.path.realpath(__file__))
# Numba's file-backed locators, in its own order of preference: the user's NUMBA_CACHE_DIR, the
# source's __pycache__, the user-wide cache folder.
BASE_LOCATORS = (caching.UserProvidedCacheLocator, caching.InTreeCacheLocator, caching.UserWideCacheLocator)


def source_stamp(root=PACKAGE_DIR):
    """sha256 (hex) of the relative path and the bytes of every .py file under root, in sorted order."""
    h = hashlib.sha256()
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                h.update(os.path.relpath(path, root).encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


def keyed_locator(base, root, stamp):
    """A subclass of Numba's locator `base` for the kernels of files under `root` only, whose
    source stamp is `stamp` (Numba recompiles a kernel whose cached stamp differs)."""
    class Keyed(base):
        package_root = root

        @classmethod
        def from_function(cls, py_func, py_file):
            if not os.path.realpath(py_file).startswith(root + os.sep):
                return None  # another package's function: Numba's own locators take it
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return stamp

    Keyed.__name__ = Keyed.__qualname__ = f"HintsSources{base.__name__}"
    return Keyed


def register(root=PACKAGE_DIR):
    """Put the keyed locators of the package at `root` in front of Numba's list (once per root).
    Returns its source stamp."""
    stamp = source_stamp(root)
    locators = caching.CacheImpl._locator_classes
    if not any(getattr(c, "package_root", None) == root for c in locators):
        locators[:0] = [keyed_locator(base, root, stamp) for base in BASE_LOCATORS]
    return stamp
