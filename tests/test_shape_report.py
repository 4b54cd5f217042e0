"`tools/shape_report.py` prints issue 29's density table, measured on a checkout made here."
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / 'tools' / 'shape_report.py'
MANY = 'def many(a, b, c, d, e, f, g, h, i, j):\n    "Ten parameters."\n    return a'
SHORT = "def short(x):\n    return x + '" + 'x' * 90 + "'"


def test_density_table(tmp_path):
    (tmp_path / 'nbs').mkdir()
    (tmp_path / 'reveal_kit').mkdir()
    (tmp_path / 'reveal_kit' / 'm.py').write_text(f"{MANY}\n\n\n{SHORT}\n")
    out = subprocess.run([sys.executable, str(TOOL), str(tmp_path)], capture_output=True, text=True, check=True).stdout
    a, b = sorted((len(MANY), len(SHORT)))
    assert f"| function length, median / 90th percentile (characters) | {(a + b) / 2:,.0f} / {b:,} |" in out, out
    code = (MANY + '\n' + SHORT).splitlines()
    assert f"| mean line length; share of lines over 100 characters | {sum(map(len, code)) / len(code):.1f}; " \
           f"{100 / len(code):.1f} % |" in out, out
    assert '| functions with 10 or more parameters | 1 (largest 10) |' in out, out
    assert '| functions with more than 8 parameters | 1 |' in out, out
