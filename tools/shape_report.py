"""Print the shape of the notebooks and the library: export-cell sizes, definitions per cell, public names never shown
in their own notebook, long lines, `;` joins, module sizes, kit imports inside functions and import cycles.
Usage: python tools/shape_report.py [ROOT]   (ROOT: a checkout, default .)"""
import ast, json, re, statistics, sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else '.')

def export_cells(nb: Path):
    "(source without directives, is_export) for every code cell of a notebook."
    for c in json.loads(nb.read_text())['cells']:
        if c['cell_type'] != 'code': continue
        s = ''.join(c['source'])
        yield '\n'.join(l for l in s.splitlines() if not l.startswith('#|')), bool(re.match(r'\s*#\|\s*export', s))

sizes, multi, public, unshown = [], 0, 0, []
for nb in sorted((root / 'nbs').glob('*.ipynb')):
    cells = list(export_cells(nb))
    shown = '\n'.join(s for s, ex in cells if not ex)
    for src, ex in cells:
        if not ex: continue
        try: tree = ast.parse(src)
        except SyntaxError: continue
        defs = [d for d in tree.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        if not defs: continue
        sizes.append(sum(1 for l in src.splitlines() if l.strip()))
        pub = [d.name for d in defs if not d.name.startswith('_')]
        multi += len(pub) > 1
        for n in pub:
            public += 1
            if not re.search(rf'\b{re.escape(n)}\b', shown): unshown.append(f'{nb.stem}:{n}')

lines = long = semis = 0
mods, inner, graph = {}, 0, {}
for f in sorted((root / 'reveal_kit').glob('*.py')):
    if f.name == '_modidx.py': continue
    text = f.read_text()
    mods[f.stem] = len(text.splitlines())
    for l in text.splitlines():
        lines += 1
        long += len(l) > 120
        semis += len(re.findall(r';\s*\S', re.sub(r"(['\"]).*?\1", '', l)))
    tree = ast.parse(text)
    deps = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level == 1 or (node.module or '').startswith('reveal_kit')):
            deps.add((node.module or '').replace('reveal_kit.', '').split('.')[0])
    graph[f.stem] = deps
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner += sum(isinstance(n, ast.ImportFrom) and (n.level == 1 or (n.module or '').startswith('reveal_kit'))
                         for n in ast.walk(fn))

def cycles():
    "Pairs of modules that import each other (directly or through others)."
    def reach(a):
        seen, todo = set(), [a]
        while todo:
            for d in graph.get(todo.pop(), ()):
                if d not in seen: seen.add(d); todo.append(d)
        return seen
    r = {m: reach(m) for m in graph}
    return sorted({tuple(sorted((a, b))) for a in graph for b in r[a] if b != a and a in r.get(b, ())})

print(f"export cells defining something: {len(sizes)}; median {statistics.median(sizes):.0f} lines; "
      f"{multi} define more than one public name")
print(f"public names: {public}; not shown in their own notebook: {len(unshown)}")
print(f"library lines: {lines}; > 120 chars: {long} ({100 * long / max(lines, 1):.1f} %); ';' joins: {semis}")
print(f"kit imports inside functions: {inner}; import cycles: {cycles() or 'none'}")
print("largest modules: " + ', '.join(f"{m} {n}" for m, n in sorted(mods.items(), key=lambda x: -x[1])[:6]))
if '-v' in sys.argv: print('\n'.join(unshown))
