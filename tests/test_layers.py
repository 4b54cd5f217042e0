"""The library's layers: each room imports only from the rooms above it, never a private name of another module (nor
reads one as an attribute: `om._vecs` where `_vecs` is defined in another module), and no module imports itself back
through others, not even from inside a function. A failure names the offending line."""
import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / 'reveal_kit'
# Top to bottom. A module may import modules of its own room and of the rooms listed before its room. PACE comes after
# REVEAL: PACE's offline policy answers with REVEAL's offline answer rule, so offline comparisons of the two methods
# differ only in the evidence each gathers (nbs/33_pace.agent). REVEAL never imports PACE.
LAYERS = ['options', 'settings', 'core', 'text', 'io', 'record', 'question', 'protocols', 'backends', 'retrieval',
          'video', 'testing', 'synth', 'memory', 'reveal', 'pace', 'eval', 'cli']


def module_name(path: Path) -> str:
    "`reveal_kit/reveal/agent.py` → `reveal_kit.reveal.agent`."
    parts = path.relative_to(LIB.parent).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(LIB.rglob('*.py')) if p.name != '_modidx.py'}


def kit_imports(path: Path):
    "(line, imported module, imported names) for every import of the kit in a file, at any depth."
    me = module_name(path)
    pkg = me if path.name == '__init__.py' else me.rsplit('.', 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split('.')[:len(pkg.split('.')) - node.level + 1]
                mod = '.'.join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ''
            if mod == 'reveal_kit' or mod.startswith('reveal_kit.'):
                yield node.lineno, mod, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith('reveal_kit'): yield node.lineno, a.name, []


def room(mod: str) -> str:
    "`reveal_kit.eval.figures.pace` → `eval`; `reveal_kit.core` → `core`."
    parts = mod.split('.')
    return parts[1] if len(parts) > 1 else ''


def resolve(mod: str, names: list[str], mods: dict) -> list[str]:
    "The modules an import reaches: `from reveal_kit.reveal import agent` reaches the submodule."
    subs = [f'{mod}.{n}' for n in names if f'{mod}.{n}' in mods]
    return subs or [mod]


def test_layers_cover_every_room():
    "Every module belongs to a room the layer list names (a new room must be placed in the order)."
    rooms = {room(m) for m in modules()} - {''}
    assert rooms <= set(LAYERS), f"rooms missing from LAYERS: {sorted(rooms - set(LAYERS))}"


def test_rooms_import_only_from_above():
    "No import runs against the data flow."
    bad = []
    for me, path in modules().items():
        mine = room(me)
        if not mine: continue
        for line, mod, names in kit_imports(path):
            if mod == 'reveal_kit' and names == ['__version__']: continue
            for target in resolve(mod, names, modules()):
                theirs = room(target)
                if theirs == mine or not theirs: continue
                if LAYERS.index(theirs) > LAYERS.index(mine):
                    bad.append(f"{path.relative_to(LIB.parent)}:{line}: {mine} imports {target} (room {theirs} "
                               f"is below {mine})")
    assert not bad, 'imports against the layers:\n' + '\n'.join(bad)


def test_no_private_names_across_modules():
    "A module never imports another module's private (`_name`) definitions."
    bad = [f"{path.relative_to(LIB.parent)}:{line}: imports {n} from {mod}"
           for me, path in modules().items() for line, mod, names in kit_imports(path)
           for n in names if n.startswith('_') and not (n.startswith('__') and n.endswith('__'))]
    assert not bad, 'private names imported across modules:\n' + '\n'.join(bad)


# Attribute reads of a private name that no kit module defines where it is read, allowed with the reason.
ALLOWED_PRIVATE = {
    ('reveal_kit/backends/vllm.py', '_finish'):
        'VLLMModel subclasses backends.chat.ChatModel and finishes a batch reply with its base class\'s helper',
}


def is_private(name: str) -> bool:
    return name.startswith('_') and not (name.startswith('__') and name.endswith('__'))


def defined_names(tree: ast.AST) -> set[str]:
    "Every name a module defines: functions, classes, assigned names and attributes, imported aliases."
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)): out.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store): out.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store): out.add(n.attr)
        elif isinstance(n, ast.alias): out.add((n.asname or n.name).split('.')[0])
    return out


def private_reads(tree: ast.AST):
    "(line, expression, name) for each `x._name` and `getattr(x, '_name')` in a module."
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and is_private(n.attr):
            yield n.lineno, ast.unparse(n), n.attr
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
              and n.func.id in ('getattr', 'hasattr', 'setattr') and len(n.args) > 1
              and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str)
              and is_private(n.args[1].value)):
            yield n.lineno, ast.unparse(n), n.args[1].value


def test_no_private_attributes_across_modules():
    "A module reads a private attribute only when it defines that name itself (`self._x` of its own class)."
    bad = []
    for me, path in modules().items():
        tree = ast.parse(path.read_text())
        mine, rel = defined_names(tree), str(path.relative_to(LIB.parent))
        bad += [f"{rel}:{line}: reads {expr}, a private name defined in another module"
                for line, expr, name in private_reads(tree)
                if name not in mine and (rel, name) not in ALLOWED_PRIVATE]
    assert not bad, 'private attributes read across modules:\n' + '\n'.join(sorted(set(bad)))


def test_allowed_private_reads_are_still_needed():
    "Each allow-list entry names a read that is still there (a stale entry would hide a new one)."
    reads = {(str(p.relative_to(LIB.parent)), name) for p in modules().values()
             for _, _, name in private_reads(ast.parse(p.read_text()))}
    assert set(ALLOWED_PRIVATE) <= reads, sorted(set(ALLOWED_PRIVATE) - reads)


def cycles(graph: dict[str, set]) -> list[list[str]]:
    "Every strongly connected group of more than one module (Tarjan)."
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1
        stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index: visit(v)
    return out


def test_no_import_cycles():
    "No module reaches itself through the kit's imports, counting imports inside functions."
    mods = modules()
    graph, where = {}, {}
    for me, path in mods.items():
        for line, mod, names in kit_imports(path):
            for target in resolve(mod, names, mods):
                if target in mods and target != me and not target.endswith('reveal_kit'):
                    graph.setdefault(me, set()).add(target)
                    where[me, target] = f"{path.relative_to(LIB.parent)}:{line}"
    found = cycles(graph)
    lines = [' → '.join(c) + ': ' + ', '.join(where[a, b] for a in c for b in c if (a, b) in where) for c in found]
    assert not found, 'import cycles:\n' + '\n'.join(lines)


@pytest.mark.parametrize('bad_import, expect', [
    ('from ..eval.runner import run_eval', 'reveal imports reveal_kit.eval.runner'),
    ('from .agent import _private', 'imports _private'),
    ('from .agent import OnlineMemory\nv = OnlineMemory()._vecs', r'reads OnlineMemory\(\)._vecs'),
    ("from . import agent\nv = getattr(agent, '_private')", "reads getattr\\(agent, '_private'\\)"),
])
def test_the_rules_catch_a_violation(tmp_path, monkeypatch, bad_import, expect):
    "The checks fail, naming the line, on a module that breaks them."
    fake = tmp_path / 'reveal_kit'
    (fake / 'reveal').mkdir(parents=True)
    (fake / '__init__.py').write_text('')
    (fake / 'reveal' / '__init__.py').write_text('"""r"""\n')
    (fake / 'reveal' / 'agent.py').write_text('_private = 1\n'
                                              'class OnlineMemory:\n    def __init__(self): self._vecs = None\n')
    (fake / 'reveal' / 'planner.py').write_text(f'x = 1\n{bad_import}\n')
    (fake / 'eval').mkdir()
    (fake / 'eval' / '__init__.py').write_text('')
    (fake / 'eval' / 'runner.py').write_text('from ..reveal.planner import x\n')
    monkeypatch.setattr(f'{__name__}.LIB', fake)
    with pytest.raises(AssertionError, match=expect) as e:
        test_rooms_import_only_from_above()
        test_no_private_names_across_modules()
        test_no_private_attributes_across_modules()
    assert any(f'reveal_kit/reveal/planner.py:{n}' in str(e.value) for n in (2, 3))


def test_a_cycle_through_a_function_level_import_is_found(tmp_path, monkeypatch):
    "A cycle hidden behind an import inside a function counts."
    fake = tmp_path / 'reveal_kit'
    (fake / 'reveal').mkdir(parents=True)
    (fake / '__init__.py').write_text('')
    (fake / 'reveal' / 'agent.py').write_text('from .planner import x\n')
    (fake / 'reveal' / 'planner.py').write_text('x = 1\ndef later():\n    from .agent import y\n')
    monkeypatch.setattr(f'{__name__}.LIB', fake)
    with pytest.raises(AssertionError, match=r'reveal_kit.reveal.agent → reveal_kit.reveal.planner') as e:
        test_no_import_cycles()
    assert 'reveal_kit/reveal/planner.py:3' in str(e.value)
