"""Structural rules of the package that review relies on: collectives in one module, core/ on torch alone,
checkpoints through the trainer's public attributes, no import cycles, files and functions of a readable size."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "training_wizard"
COLLECTIVE = re.compile(
    r"accelerator\.(reduce|gather|broadcast|wait_for_everyone|get_state_dict)\(|gather_object|broadcast_object_list"
    r"|torch\.distributed|all_reduce|all_gather"
)
# Sharding a model is not a collective in itself (like accelerator.prepare); its forward passes are.
WRAPPING = re.compile(r"from torch\.distributed\.fsdp import fully_shard$")


def test_collectives_are_called_only_from_the_collectives_module():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "collectives.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if COLLECTIVE.search(code) and not WRAPPING.search(code):
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not offenders, "collectives outside collectives.py:\n" + "\n".join(offenders)


def test_core_imports_only_torch():
    for path in sorted((PACKAGE / "core").glob("*.py")):
        imports = re.findall(r"^\s*(?:from|import) ([\w.]+)", path.read_text(), flags=re.M)
        foreign = [name for name in imports if not name.startswith(("torch", "training_wizard.core", "__future__",
                                                                    "dataclasses", "typing", "math"))]
        assert not foreign, f"{path.name} imports {foreign}"


def test_checkpoint_uses_no_private_trainer_attributes():
    text = (PACKAGE / "checkpoint.py").read_text()
    assert not re.search(r"trainer\._", text)


# -- import graph -----------------------------------------------------------------------------------------------
def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `path` imports anywhere in its body (inside functions too). `from a import b`
    counts as importing the module a.b when there is one, else a; a relative import is resolved from the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a name inside a module: that module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit to meet on a deep import chain)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


# Import cycles still to break, if one ever has to be let in for a while; empty.
ALLOWED_CYCLES: list[set[str]] = []


def test_no_import_cycle_among_the_package_modules():
    modules = package_modules()
    graph = {name: imported_modules(path, modules) for name, path in modules.items()}
    cycles = [set(c) for c in strongly_connected_components(graph) if len(c) > 1]
    unexpected = [" <-> ".join(sorted(c)) for c in cycles if c not in ALLOWED_CYCLES]
    assert not unexpected, "modules that import each other (directly or around a circle):\n" + "\n".join(unexpected)
    gone = [" <-> ".join(sorted(c)) for c in ALLOWED_CYCLES if c not in cycles]
    assert not gone, "no longer a cycle; remove it from ALLOWED_CYCLES:\n" + "\n".join(gone)


def test_the_cycle_finder_finds_a_circle_and_only_it():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert sorted(sorted(c) for c in strongly_connected_components(graph) if len(c) > 1) == [["a", "b", "c"]]


def test_no_module_imports_a_private_name_of_another():
    """A leading underscore says "only this module uses it"; a name others need is made public where it lives."""
    modules = package_modules()
    offenders = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("training_wizard")):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                offenders += [f"{name}:{node.lineno}: {'.' * node.level}{node.module or ''}.{p}" for p in private]
    assert not offenders, "private names imported across modules:\n" + "\n".join(offenders)


# -- sizes ------------------------------------------------------------------------------------------------------
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 60  # the def line through the body's last line
# Files and functions still over a limit while they are reworked; empty these as they go.
ALLOWED_LONG_FILES: set[str] = set()
ALLOWED_LONG_FUNCTIONS: set[str] = set()  # "path/to/file.py:qualified.name"


def long_functions(path: Path) -> list[tuple[str, int]]:
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = child.end_lineno - child.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        found.append((name, length))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), str(path)), "")
    return found


def test_no_file_or_function_is_over_its_size_limit():
    long_files, long_functions_found = {}, {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(PACKAGE.parent))
        lines = len(path.read_text().splitlines())
        if lines > MAX_FILE_LINES:
            long_files[relative] = lines
        for name, length in long_functions(path):
            long_functions_found[f"{relative}:{name}"] = length
    too_long = [f"{name}: {lines} lines (at most {MAX_FILE_LINES})" for name, lines in long_files.items()
                if name not in ALLOWED_LONG_FILES]
    too_long += [f"{name}: {lines} lines (at most {MAX_FUNCTION_LINES})" for name, lines in long_functions_found.items()
                 if name not in ALLOWED_LONG_FUNCTIONS]
    assert not too_long, "split these by responsibility:\n" + "\n".join(too_long)
    short_now = sorted((ALLOWED_LONG_FILES - set(long_files)) | (ALLOWED_LONG_FUNCTIONS - set(long_functions_found)))
    assert not short_now, "within the limits now; remove them from the allow-lists:\n" + "\n".join(short_now)
