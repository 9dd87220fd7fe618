"""The repo's layout rules, checked on its source: data flows one way (data -> hints -> model ->
train -> train_gpt.py), `hints/` imports no torch, `model/` imports neither `hints/` nor `data/`,
nothing imports the entry point, no module imports another that imports it back (directly or
through others), no file edits sys.path, and nothing points outside the repo for its design.
hints/ in wings: its sub-packages reach each other only through the top level and index/, each
behind a short face, and the paths the import graph does not show (python -m, file names in the
docs) name what is there."""
import ast
import importlib
import os
import re
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
    ("hints", {"model", "train", "train_gpt", "torch"}),  # hints/exact/ may import torch lazily, in functions
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


def module_name(path):
    """The dotted name a repo file imports as: hints/index/store.py -> hints.index.store, hints/__init__.py -> hints."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph():
    """{module: the repo modules it imports}, from every import statement in its source: at module
    level and inside functions alike (a lazy import still closes a circle; it only runs it later).
    `from P import x` is an edge to P.x when that is a module, else to P; relative imports resolve
    against the file's package. Importing P.x also runs P's __init__, but that implicit edge is
    left out: every package's __init__ importing its own submodules would otherwise be a circle."""
    files = {module_name(p): p for p in python_files()}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:
                    targets.add(f"{base}.{a.name}" if f"{base}.{a.name}" in files else base)
        graph[name] = sorted(t for t in targets if t in files and t != name)
    return graph


def import_cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted: every
    module in one imports, step by step, every other."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_the_cycle_finder_sees_a_circle_and_a_lazy_one():
    graph = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"], "e": ["f"], "f": ["e"], "g": []}
    assert import_cycles(graph) == [["a", "b", "c"], ["e", "f"]]
    assert "hints.exact.triton_count" in import_graph()["hints.exact.count"]  # a function-level import is an edge


def test_no_import_cycles():
    cycles = import_cycles(import_graph())
    assert not cycles, "modules that import each other (move the shared piece to the module that owns it): " + \
        "; ".join(" <-> ".join(c) for c in cycles)


# ---- hints/ in wings -----------------------------------------------------------------------------
HINTS = REPO / "hints"
WINGS = sorted(p.name for p in HINTS.iterdir() if (p / "__init__.py").is_file())  # the sub-packages
ENTRY_MODULES = ("hints", "hints.__main__", "hints.cli")  # the face and the command line: they may reach any face
TOOLS = "bench"      # the tools: they reach the other wings through their faces
SHARED_WING = "index"  # what the other wings share (the hashed index's geometry, results, search)
MAX_FILE_LINES = 600
MAX_TOP_LEVEL_MODULES = 12
MAX_FACE_DOC_LINES = 6


def wing_of(module):
    """'index' for hints.index and hints.index.store; None for hints and its top-level modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in WINGS else None


def hints_edges():
    return [(m, t) for m, targets in import_graph().items() if m.split(".")[0] == "hints"
            for t in targets if t.split(".")[0] == "hints"]


def test_the_wings_reach_each_other_only_through_the_top_level_and_index():
    """A top-level module (the shared vocabulary) imports no wing; a wing imports the top-level
    modules, its own modules and index/'s face; positional/, exact/ and draft/ import no other
    wing; bench/ (the tools) imports the others' faces and may read index/'s kernels, which it
    times. Nothing in a wing imports the package face `hints` (it imports every wing)."""
    bad = []
    for m, t in hints_edges():
        a, b = wing_of(m), wing_of(t)
        if m in ENTRY_MODULES:
            ok = b is None or t == f"hints.{b}" or (m == "hints" and t == "hints.numba_cache")
        elif a is None:
            ok = b is None and t != "hints"
        elif b is None:
            ok = t != "hints"
        elif a == b:
            ok = True
        elif a == TOOLS:
            ok = t == f"hints.{b}" or b == SHARED_WING
        else:
            ok = t == f"hints.{SHARED_WING}"
        if not ok:
            bad.append(f"{m} -> {t}")
    assert not bad, "imports against the wings' rules (module docstring): " + "; ".join(bad)


def runnable_modules():
    """hints modules run with `python -m` (they have a __main__ block): their own entry points."""
    return {module_name(p) for p in HINTS.rglob("*.py") if 'if __name__ == "__main__":' in p.read_text()}


def test_code_outside_hints_uses_its_faces():
    """train/, scripts/, train_gpt.py (and data/, model/) import hints through `hints`, a wing's face
    (hints.index, ...), a top-level module (hints.tokens, ...) or a module run with -m, never a
    wing's other modules; the tests may reach inside to check them."""
    allowed = {"hints"} | {f"hints.{w}" for w in WINGS} | runnable_modules() | {
        f"hints.{p.stem}" for p in HINTS.glob("*.py") if p.stem != "__init__"}
    graph = import_graph()
    bad = [f"{m} -> {t}" for m, targets in graph.items() if m.split(".")[0] not in ("hints", "tests")
           for t in targets if t.split(".")[0] == "hints" and t not in allowed]
    assert not bad, "imports of a wing's inner modules (import its face instead): " + "; ".join(bad)


def test_nothing_imports_a_private_name_of_hints_or_reads_the_index_privately():
    """No module outside hints/index/ (tests aside) imports a private name from hints (`_human` was
    one), reads a private attribute of HintIndex (the drafter read `_side`, `_lengths`, ...), or
    calls the lookup kernels with their argument lists (HintIndex.search_arrays and
    hints.index.search_sealed are the door)."""
    tree = ast.parse((HINTS / "index" / "hint_index.py").read_text())
    private = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
               and n.value.id == "self" and n.attr.startswith("_") and not n.attr.startswith("__")}
    assert {"_side", "_lengths", "_pows", "_bits", "_shifts"} <= private
    kernels = {"lookup_sorted", "lookup_scan", "seal_partitions", "stage1_worker", "stage2_place"}
    bad = []
    for path in python_files():
        rel = path.relative_to(REPO)
        if rel.parts[0] == "tests" or rel.parts[:2] == ("hints", "index") or rel == Path("scripts/target_ab.py"):
            continue  # target_ab times old revisions too, whose HintIndex has nothing else to offer
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("hints", "") and any(
                    a.name.startswith("_") for a in node.names) and (node.level == 0 or rel.parts[0] == "hints"):
                bad.append(f"{rel}:{node.lineno} imports {[a.name for a in node.names if a.name.startswith('_')]}")
            if isinstance(node, ast.Attribute) and node.attr in private and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                bad.append(f"{rel}:{node.lineno} reads .{node.attr}")
            if isinstance(node, ast.Attribute) and node.attr in kernels or isinstance(node, ast.Name) and node.id in kernels:
                bad.append(f"{rel}:{node.lineno} calls the kernel {getattr(node, 'attr', getattr(node, 'id', ''))}")
    assert not bad, "; ".join(bad)


def test_no_file_in_hints_is_long_and_the_top_level_is_small():
    long = {str(p.relative_to(REPO)): n for p in HINTS.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long, f"files over {MAX_FILE_LINES} lines: {long}"
    top = sorted(p.name for p in HINTS.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"hints/ holds {len(top)} modules (at most {MAX_TOP_LEVEL_MODULES}): {top}"
    assert {"index", "positional", "exact", "draft", "bench"} <= set(WINGS)


@pytest.mark.parametrize("wing", WINGS)
def test_each_wing_has_a_short_face(wing):
    """A wing's __init__ is a docstring of a few lines saying what it owns, imports from its own
    modules, and __all__: the names others may use, exactly those it imports."""
    path = HINTS / wing / "__init__.py"
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree)
    assert doc and len(doc.splitlines()) <= MAX_FACE_DOC_LINES, f"{path}: a docstring of 1-{MAX_FACE_DOC_LINES} lines"
    imported, listed = [], None
    for node in tree.body[1:]:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            imported += [a.asname or a.name for a in node.names]
        elif isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__all__"]:
            listed = ast.literal_eval(node.value)
        else:
            raise AssertionError(f"{path}:{node.lineno}: a face holds only its docstring, imports of its own modules "
                                 f"and __all__")
    assert listed is not None and sorted(listed) == sorted(imported), f"{path}: __all__ must list what it imports"
    face = importlib.import_module(f"hints.{wing}")
    assert all(hasattr(face, name) for name in listed)


def module_exists(name):
    """Whether the dotted name is a module or package of the repo (a file, or a folder with __init__.py)."""
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def resolves(dotted):
    """Whether hints.a.b.c names a module, or an attribute of the longest module it starts with."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        if module_exists(".".join(parts[:k])):
            obj = importlib.import_module(".".join(parts[:k]))
            for attr in parts[k:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
    return False


DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
CODE_TEXT = [p for p in python_files() if p.parent.name != "tests"] + sorted((REPO / "scripts").glob("*.sh")) + [
    REPO / "run.sh", REPO / "test.sh", REPO / "requirements.txt", REPO / "pyproject.toml"]  # tests name old revisions' files


def test_paths_the_import_graph_does_not_show_name_what_is_there():
    """Every `python -m M` and `"-m", "M"` in the code and the docs runs a module that exists; every
    hints/... file or folder the docs and the code's comments name exists; every dotted hints.x.y
    the docs name is a module or an attribute of one."""
    bad = []
    for path in DOCS + CODE_TEXT:
        text = path.read_text()
        rel = path.relative_to(REPO)
        for m in re.findall(r'(?:python3? -m |"-m", ")((?:hints|data|train|model)(?:\.\w+)*)', text):
            if not (module_exists(m) and (REPO.joinpath(*m.split(".")).with_suffix(".py").is_file()
                                          or (REPO.joinpath(*m.split(".")) / "__main__.py").is_file())):
                bad.append(f"{rel}: -m {m}")
        for f in re.findall(r"(?<![\w/.-])(hints/(?:\w+/)*(?:\w+\.(?:py|json)\b)?)", text):
            if not (REPO / f).exists():
                bad.append(f"{rel}: {f}")
        if path in DOCS:
            for d in re.findall(r"(?<![\w/.-])(hints(?:\.[A-Za-z_]\w*)+)", text):
                if not resolves(d):
                    bad.append(f"{rel}: {d}")
    assert not bad, "names of things that are not there: " + "; ".join(sorted(set(bad)))


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
            ["-m", "data.canonical_mask"],
            ["scripts/ablate.py"], ["scripts/compare.py"], ["scripts/cpu_ab.py"], ["scripts/hints_ab.py"],
            ["scripts/lookup_state.py"], ["scripts/scatter_ab.py"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help(command):
    env = dict(os.environ, PYTHONPATH=str(REPO))  # the checkout's packages, installed or not
    p = subprocess.run([sys.executable, *command, "--help"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and "usage:" in p.stdout, p.stderr[-2000:]


# The entry point reads like the outline of a run (set-up, model, hints, warm-up, the timed loop, the
# summary); its plumbing lives in train/. The bounds: issue 31's "main() about 120 lines, no call over about
# 6 keyword arguments" (a call that needs more takes the run's state, train/run.py's Run).
MAIN_MAX_LINES = 125
CALL_MAX_KEYWORDS = 6


def test_train_gpt_main_is_an_outline():
    tree = ast.parse((REPO / "train_gpt.py").read_text())
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    lines = main.end_lineno - main.lineno + 1
    assert lines <= MAIN_MAX_LINES, f"train_gpt.py: main() runs {lines} lines (at most {MAIN_MAX_LINES})"
    # dict(...) is exempt: the presets are tables of values, not calls that thread the run's state
    crowded = [(n.lineno, ast.unparse(n.func), len(n.keywords)) for n in ast.walk(tree)
               if isinstance(n, ast.Call) and len(n.keywords) > CALL_MAX_KEYWORDS and ast.unparse(n.func) != "dict"]
    assert not crowded, f"train_gpt.py: calls with more than {CALL_MAX_KEYWORDS} keyword arguments (line, call, count): {crowded}"
