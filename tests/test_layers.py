"""The library's layers: each room imports only from the rooms above it, never a private name of another module, and no
module imports itself back through others, not even from inside a function. A failure names the offending line."""
import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / 'reveal_kit'
# Top to bottom. A module may import modules of its own room and of the rooms listed before its room. PACE comes after
# REVEAL: PACE's offline policy answers with REVEAL's offline answer rule, so offline comparisons of the two methods
# differ only in the evidence each gathers (nbs/33_pace.agent). REVEAL never imports PACE.
LAYERS = ['options', 'settings', 'core', 'text', 'io', 'record', 'backends', 'retrieval', 'video', 'testing', 'synth', 'memory', 'reveal', 'pace', 'eval',
          'cli']


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
])
def test_the_rules_catch_a_violation(tmp_path, monkeypatch, bad_import, expect):
    "The checks fail, naming the line, on a module that breaks them."
    fake = tmp_path / 'reveal_kit'
    (fake / 'reveal').mkdir(parents=True)
    (fake / '__init__.py').write_text('')
    (fake / 'reveal' / '__init__.py').write_text('"""r"""\n')
    (fake / 'reveal' / 'agent.py').write_text('_private = 1\n')
    (fake / 'reveal' / 'planner.py').write_text(f'x = 1\n{bad_import}\n')
    (fake / 'eval').mkdir()
    (fake / 'eval' / '__init__.py').write_text('')
    (fake / 'eval' / 'runner.py').write_text('from ..reveal.planner import x\n')
    monkeypatch.setattr(f'{__name__}.LIB', fake)
    with pytest.raises(AssertionError, match=expect) as e:
        test_rooms_import_only_from_above()
        test_no_private_names_across_modules()
    assert 'reveal_kit/reveal/planner.py:2' in str(e.value)


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
