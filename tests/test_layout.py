"""The package's layout holds: no import cycles among orl's modules, no module patching of another
module's names, and every document the code cites lives in the repository.

Imports are read from the source (ast), top-level and function-local alike, so a cycle hidden
behind a lazy import counts too; ``TYPE_CHECKING`` blocks are skipped.
"""
import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "orl")


def _modules() -> dict[str, str]:
    out = {}
    for d, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[rel[:-9] if rel.endswith(".__init__") else rel] = path
    return out


def _imports(name: str, path: str, known: set[str]) -> set[str]:
    tree = ast.parse(open(path).read())
    pkg = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rsplit(".", 1)[0] if "." in t else ""
            if t and t != name:
                found.add(t)
    return found


def _graph():
    mods = _modules()
    known = set(mods)
    graph = {m: _imports(m, p, known) for m, p in mods.items()}
    # importing a module runs its packages' __init__ first: an edge to a package is an edge to its __init__
    return graph


def _cycles(graph) -> list[list[str]]:
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def _ignoring_parents(graph):
    """Edges from a module to its own parent packages are how Python imports work, not a cycle of design."""
    return {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}


def test_no_import_cycles():
    cycles = _cycles(_ignoring_parents(_graph()))
    assert not cycles, f"import cycles in orl/: {cycles}"


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_patches_another_modules_names():
    """No ``module.attr = ...`` on an imported module (hidden global state, STYLE.md 9)."""
    bad = []
    # the sandbox's child process disables file and process primitives in itself before it runs
    # untrusted code: patching is that module's whole job, and it happens in a separate process
    allowed = {"orl.eval.sandbox_child"}
    for name, path in _modules().items():
        if name in allowed:
            continue
        tree = ast.parse(open(path).read())
        imported = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                    for a in n.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                        if isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name) and el.value.id in imported \
                                and el.value.id not in ("os",):
                            bad.append(f"{name}: {ast.unparse(el)}")
    assert not bad, bad


def test_cited_documents_live_in_the_repository():
    """Every ``*.md`` the code, tests, benchmarks or docs cite exists in the repository."""
    cite = re.compile(r"([A-Za-z0-9_./-]*[A-Za-z0-9_-]+\.md)\b")
    missing = set()
    for top in ("orl", "tests", "benchmarks", "docs", "examples", "scripts"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if not f.endswith((".py", ".md", ".sh")) or f == "LOG.md":  # the dated log is history, kept as written
                    continue
                text = open(os.path.join(d, f), errors="replace").read()
                for m in cite.findall(text):
                    if m.startswith(("http", "//")) or m in ("README.md", "main_table.md"):  # main_table.md: an output
                        continue
                    cands = [os.path.join(ROOT, m), os.path.join(d, m), os.path.join(ROOT, "docs", os.path.basename(m)),
                             os.path.join(ROOT, "benchmarks", os.path.basename(m))]
                    if not any(os.path.exists(c) for c in cands) or "shared/" in m:
                        missing.add(f"{os.path.relpath(os.path.join(d, f), ROOT)}: {m}")
    assert not missing, sorted(missing)
