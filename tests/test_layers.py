"""The import layers: which part of foldgate may import which.

Every ``.py`` file under the shipped folders (gateway, store, router, offline, loadtests,
bench, deploy, examples, scripts) and ``tests/`` is parsed with ``ast``; every
import counts, at module level or inside a function, ``TYPE_CHECKING`` blocks included. An
import names the module it reads from (``from a.b import c`` reads ``a.b.c`` when that is a
module, else ``a.b``). Each module belongs to the area of its longest matching prefix:

    area               modules                                    may import (besides itself)
    ground             gateway.transcript gateway.lru             -
                       gateway.tokens gateway.sse
    dialects           gateway.dialects                           ground
    store              store                                      ground dialects
    fold               gateway.fold                               ground dialects store
    router             router                                     ground dialects store fold
    upstream           gateway.upstream                           ground dialects store fold router
    request path       gateway                                    ground dialects store fold router
                                                                  upstream
    deploy             deploy                                     ground dialects store fold router
                                                                  upstream request path
    offline.importers  offline.importers                          ground dialects store fold router
                                                                  upstream request path
    offline            offline                                    ground dialects store fold router
                                                                  upstream request path deploy
                                                                  offline.importers
    loadtests          loadtests                                  ground dialects store fold router
                                                                  upstream request path deploy
                                                                  offline.importers offline
    bench              bench                                      every area but tests
    scripts            scripts                                    every area but tests
    examples           examples                                   -
    tests              tests                                      every area

The plug points follow the pipeline (dialects -> store -> fold -> router -> upstream): each
imports the ground floor and earlier plug points, never a later one nor the request path.
The request path (``gateway.steps``, ``gateway.pipeline``, ``gateway.app``, ``gateway.serve*``
and the other gateway modules) never imports the tools (deploy, offline, loadtests, bench).
``deploy`` launches vLLM replicas for the tools. ``loadtests`` drives live gateways with the
sessions ``offline`` reads and reads its runs back with ``offline.locust_runs``; ``offline``
needs nothing live and never imports ``loadtests``; ``bench`` and ``scripts`` may use
anything but ``tests``. Nothing but ``tests`` imports ``tests``, and an example is what a user
writes: it imports no foldgate.

Two more rules hold everywhere, tests included: no module imports a private (``_name``) name
of another module (``from x import _y``), nor reads one through an imported module
(``x._y``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The folders whose files are checked; a top-level name here is a project package.
PACKAGES = (
    *("gateway", "store", "router", "offline", "loadtests", "bench", "deploy", "examples"),
    "scripts",
)
CHECKED = (*PACKAGES, "tests")

PLUG_POINTS = ("dialects", "store", "fold", "router", "upstream")
SERVING = ("ground", *PLUG_POINTS, "request path")
EVERY_AREA = "every area"


@dataclass(frozen=True)
class Area:
    name: str
    modules: tuple[str, ...]
    may_import: tuple[str, ...]


def _plug_point(index: int, module: str) -> Area:
    return Area(PLUG_POINTS[index], (module,), ("ground", *PLUG_POINTS[:index]))


AREAS: tuple[Area, ...] = (
    Area("ground", ("gateway.transcript", "gateway.lru", "gateway.tokens", "gateway.sse"), ()),
    _plug_point(0, "gateway.dialects"),
    _plug_point(1, "store"),
    _plug_point(2, "gateway.fold"),
    _plug_point(3, "router"),
    _plug_point(4, "gateway.upstream"),
    Area("request path", ("gateway",), ("ground", *PLUG_POINTS)),
    Area("deploy", ("deploy",), SERVING),
    Area("offline.importers", ("offline.importers",), SERVING),
    Area("offline", ("offline",), (*SERVING, "deploy", "offline.importers")),
    Area("loadtests", ("loadtests",), (*SERVING, "deploy", "offline.importers", "offline")),
    Area("bench", ("bench",), ("every area but tests",)),
    Area("scripts", ("scripts",), ("every area but tests",)),
    Area("examples", ("examples",), ()),
    Area("tests", ("tests",), (EVERY_AREA,)),
)
AREA_BY_NAME = {area.name: area for area in AREAS}


def area_of(module: str) -> Area:
    """The area of ``module``: the one with the longest prefix matching it."""
    best: tuple[int, Area] | None = None
    for area in AREAS:
        for prefix in area.modules:
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > best[0]
            ):
                best = (len(prefix), area)
    if best is None:
        raise ValueError(f"{module} belongs to no area: add it to AREAS")
    return best[1]


def allows(importer: Area, imported: Area) -> bool:
    if importer == imported or EVERY_AREA in importer.may_import:
        return True
    if "every area but tests" in importer.may_import:
        return imported.name != "tests"
    return imported.name in importer.may_import


def render_rules() -> str:
    """The rule table as the module docstring shows it."""
    lines = [f"    {'area':<19}{'modules':<43}may import (besides itself)"]
    for area in AREAS:
        modules = _wrap(area.modules, 42)
        allowed = _wrap(area.may_import or ("-",), 40)
        for i in range(max(len(modules), len(allowed))):
            name = area.name if i == 0 else ""
            left = modules[i] if i < len(modules) else ""
            right = allowed[i] if i < len(allowed) else ""
            lines.append(f"    {name:<19}{left:<43}{right}".rstrip())
    return "\n".join(lines)


def _wrap(words: Iterable[str], width: int) -> list[str]:
    lines: list[str] = []
    for word in words:
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


# ---- the import graph ----


@dataclass(frozen=True)
class Import:
    path: str  # the importing file, relative to the repository
    line: int
    importer: str  # the importing module
    module: str  # the project module it reads from
    name: str | None = None  # the name taken from it (``from module import name``)


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(root: Path, folders: Iterable[str] = CHECKED) -> dict[str, Path]:
    return {
        module_name(path, root): path
        for folder in folders
        for path in sorted((root / folder).rglob("*.py"))
    }


def imports_of(source: str, path: str, importer: str, modules: set[str]) -> Iterator[Import]:
    """The project imports in ``source``: one per module read (and per name taken)."""
    is_package = path.endswith("__init__.py")
    tree = ast.parse(source, filename=path)
    aliases: dict[str, str] = {}  # local name -> project module, from ``import x [as y]``
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_project(alias.name, modules):
                    yield Import(path, node.lineno, importer, alias.name)
                    local = alias.asname or alias.name
                    aliases[local] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, importer, is_package)
            if not _is_project(base, modules):
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in modules:
                    yield Import(path, node.lineno, importer, submodule)
                    aliases[alias.asname or alias.name] = submodule
                else:
                    yield Import(path, node.lineno, importer, base, alias.name)
    # A name also bound by an assignment or a parameter may be something else where it is read.
    rebound = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    rebound |= {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.value.id not in rebound
        ):
            yield Import(path, node.lineno, importer, aliases[node.value.id], node.attr)


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    package = importer.split(".")
    if not is_package:
        package = package[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def _is_project(module: str, modules: set[str]) -> bool:
    return module.split(".")[0] in CHECKED and (
        module in modules or any(m.startswith(module + ".") for m in modules)
    )


def project_imports(root: Path = ROOT) -> list[Import]:
    modules = project_modules(root)
    found: list[Import] = []
    for module, path in modules.items():
        rel = str(path.relative_to(root))
        found.extend(imports_of(path.read_text(), rel, module, set(modules)))
    return found


# ---- the rules ----


def layer_breaks(imports: Iterable[Import]) -> list[str]:
    breaks = set()
    for imp in imports:
        importer, imported = area_of(imp.importer), area_of(imp.module)
        if not allows(importer, imported):
            allowed = ", ".join(importer.may_import) or "nothing of the project"
            rule = f"{importer.name} may import only {allowed}"
            if imported.name == "tests":
                rule = "nothing but tests imports tests"
            breaks.add(
                f"{imp.path}:{imp.line} imports {imp.module} ({imported.name}): rule broken: {rule}"
            )
    return sorted(breaks)


def private_imports(imports: Iterable[Import]) -> list[str]:
    found = set()
    for imp in imports:
        name = imp.name
        private = name is not None and name.startswith("_") and not name.startswith("__")
        if private and imp.module != imp.importer:
            found.add(
                f"{imp.path}:{imp.line} takes {imp.module}.{name}: "
                "rule broken: no module imports a private name of another module"
            )
    return sorted(found)


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return project_imports()


def test_the_docstring_shows_the_rules_enforced() -> None:
    assert render_rules() in (__doc__ or "")


def test_every_module_belongs_to_an_area() -> None:
    for module in project_modules(ROOT):
        area_of(module)  # raises for a module outside every area


def test_no_import_breaks_a_layer(imports: list[Import]) -> None:
    breaks = layer_breaks(imports)
    assert not breaks, "\n".join(["layer breaks:", *breaks])


def test_no_private_name_of_another_module_is_imported(imports: list[Import]) -> None:
    found = private_imports(imports)
    assert not found, "\n".join(["private names imported:", *found])


# ---- the checker itself ----


def _synthetic(tmp_path: Path, files: dict[str, str]) -> list[Import]:
    for rel, source in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return project_imports(tmp_path)


def test_the_checker_names_file_module_and_rule(tmp_path: Path) -> None:
    imports = _synthetic(
        tmp_path,
        {
            "store/__init__.py": "",
            "store/backend.py": "def f():\n    from gateway.fold import refold\n",
            "gateway/__init__.py": "",
            "gateway/fold/__init__.py": "",
            "gateway/fold/refold.py": "import store\n",
            "gateway/app.py": "from tests.helpers import make\nimport bench.overhead\n",
            "bench/__init__.py": "",
            "bench/overhead.py": "from loadtests.stream import read\n",
            "loadtests/__init__.py": "",
            "loadtests/stream.py": "",
            "offline/__init__.py": "",
            "offline/sim/__init__.py": "",
            "offline/sim/engine.py": "from ...loadtests.stream import read\n",
            "tests/__init__.py": "",
            "tests/helpers.py": "import bench.overhead\nfrom gateway import app\n",
        },
    )
    assert layer_breaks(imports) == [
        "gateway/app.py:1 imports tests.helpers (tests): rule broken: nothing but tests"
        " imports tests",
        "gateway/app.py:2 imports bench.overhead (bench): rule broken: request path may import"
        " only ground, dialects, store, fold, router, upstream",
        "offline/sim/engine.py:1 imports loadtests.stream (loadtests): rule broken: offline"
        " may import only ground, dialects, store, fold, router, upstream, request path,"
        " deploy, offline.importers",
        "store/backend.py:2 imports gateway.fold.refold (fold): rule broken: store may import"
        " only ground, dialects",
    ]


def test_the_checker_finds_private_names(tmp_path: Path) -> None:
    imports = _synthetic(
        tmp_path,
        {
            "router/__init__.py": "",
            "router/cost.py": "_TABLE = {}\n\ndef _own():\n    return _TABLE\n",
            "router/pool.py": (
                "from router.cost import _TABLE, __doc__\n"
                "import router.cost as cost\n"
                "from . import cost as c2\n"
                "x = cost._own() or c2._own()\n"
                "def f(router):\n    return router._state\n"
            ),
        },
    )
    assert private_imports(imports) == [
        "router/pool.py:1 takes router.cost._TABLE: rule broken: no module imports a private"
        " name of another module",
        "router/pool.py:4 takes router.cost._own: rule broken: no module imports a private"
        " name of another module",
    ]
