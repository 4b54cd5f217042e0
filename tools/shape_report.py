"""Print the shape of the notebooks and the library: module sizes, export cells with several public names, exported
definitions not followed by a cell that shows them, long functions, density, kit imports inside functions and cycles;
then the density table of issue 29 (functions at module level: length median / 90th percentile, line length, share of
code lines over 100 characters, functions with many parameters) beside its targets.
Usage: python tools/shape_report.py [ROOT] [-v]   (ROOT: a checkout, default .; -v lists every finding)"""
import ast, json, re, statistics, sys
from pathlib import Path

args = [a for a in sys.argv[1:] if not a.startswith('-')]
root = Path(args[0] if args else '.')
verbose = '-v' in sys.argv


def cells(nb: Path):
    "(source without directives, is_export, is_code) for every cell of a notebook."
    for c in json.loads(nb.read_text())['cells']:
        s = ''.join(c['source'])
        yield ('\n'.join(l for l in s.splitlines() if not l.startswith('#|')),
               c['cell_type'] == 'code' and bool(re.match(r'\s*#\|\s*export', s)), c['cell_type'] == 'code')


def top_defs(src: str) -> list[ast.AST]:
    try: tree = ast.parse(src)
    except SyntaxError: return []
    return [d for d in tree.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


multi, defs, unshown = [], 0, []
for nb in sorted((root / 'nbs').glob('*.ipynb')):
    cs = list(cells(nb))
    for i, (src, ex, code) in enumerate(cs):
        if not ex: continue
        ds = top_defs(src)
        pub = [d.name for d in ds if not d.name.startswith('_')]
        if len(pub) > 1: multi.append(f'{nb.stem}: {", ".join(pub)}')
        nxt = next((s for s, e, c in cs[i + 1:] if c), '')
        nxt_export = next((e for s, e, c in cs[i + 1:] if c), True)
        for d in ds:
            if d.name.startswith('_'): continue
            defs += 1
            if nxt_export or not re.search(rf'\b{re.escape(d.name)}\b', nxt): unshown.append(f'{nb.stem}:{d.name}')

lines, long, sizes, mods, inner, graph, fn_sizes, fn_long, n_params = [], 0, {}, {}, 0, {}, [], [], {}
for f in sorted((root / 'reveal_kit').rglob('*.py')):
    if f.name == '_modidx.py': continue
    text = f.read_text()
    name = '.'.join(f.relative_to(root / 'reveal_kit').with_suffix('').parts)
    mods[name] = len(text.splitlines())
    code = [l for l in text.splitlines() if l.strip() and not l.lstrip().startswith('#')]
    lines += [len(l) for l in code]
    long += sum(len(l) > 120 for l in code)
    tree = ast.parse(text)
    deps = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or '').startswith('reveal_kit')):
            deps.add(node.module or '')
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node in tree.body or \
                isinstance(node, ast.ClassDef) and node in tree.body:
            seg = ast.get_source_segment(text, node) or ''
            if isinstance(node, ast.ClassDef): continue
            fn_sizes.append(len(seg))
            a = node.args
            n_params[f'{name}.{node.name}'] = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
            n = node.end_lineno - node.lineno + 1
            if n > 30: fn_long.append(f'{name}.{node.name} ({n})')
    graph[name] = deps
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner += sum(isinstance(n, ast.ImportFrom) and (n.level > 0 or (n.module or '').startswith('reveal_kit'))
                         for n in ast.walk(fn) if n is not fn)

big = sorted(((m, n) for m, n in mods.items() if n > 450), key=lambda x: -x[1])
print(f"modules: {len(mods)}; over 450 lines: {len(big)} {big or ''}")
print(f"largest modules: " + ', '.join(f"{m} {n}" for m, n in sorted(mods.items(), key=lambda x: -x[1])[:6]))
print(f"export cells with several public names: {len(multi)}")
print(f"exported public definitions: {defs}; not followed by a cell that shows them: {len(unshown)}")
print(f"functions over 30 lines: {len(fn_long)}; median function {statistics.median(fn_sizes):.0f} characters")
print(f"library code lines: {len(lines)}; mean {statistics.mean(lines):.0f} characters; over 120: {long}")
print(f"kit imports inside functions: {inner}")
if verbose:
    for title, xs in (('several public names', multi), ('not shown', unshown), ('over 30 lines', fn_long)):
        print(f'\n## {title}\n' + '\n'.join(xs))


def density_table(fn_sizes: list[int], lines: list[int], n_params: dict[str, int]) -> str:
    "Issue 29's table: function length, line length and parameter counts of the library, beside the targets."
    ns = sorted(fn_sizes)
    over100 = 100 * sum(n > 100 for n in lines) / max(len(lines), 1)
    many = lambda k: [f for f, n in n_params.items() if n >= k]
    top = max(n_params.values(), default=0)
    rows = [('function length, median / 90th percentile (characters)',
             f"{statistics.median(ns):,.0f} / {ns[int(.9 * len(ns))]:,}", 'median <= 300'),
            ('mean line length; share of lines over 100 characters',
             f"{statistics.mean(lines):.1f}; {over100:.1f} %", '<= 8 %'),
            ('functions with 10 or more parameters', f"{len(many(10))} (largest {top})", ''),
            ('functions with more than 8 parameters', f"{len(many(9))}", '0 outside the CLI commands')]
    return '\n'.join(['| | reveal-kit | target |', '|---|---|---|'] + [f"| {a} | {b} | {c} |" for a, b, c in rows])


print('\n## Density (functions at module level, all modules)\n' + density_table(fn_sizes, lines, n_params))
if verbose:
    print('\n## more than 8 parameters\n' + '\n'.join(f"{f} ({n})" for f, n in
                                                       sorted(n_params.items(), key=lambda x: -x[1]) if n > 8))
