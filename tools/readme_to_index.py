"""Write nbs/index.ipynb (nbdev's readme_nb) from README.md, one markdown cell per `## ` section.
nbdev_readme needs Quarto, which the CPU install does not carry; README.md is the edited source and this keeps the two equal."""
import hashlib, json, re
from pathlib import Path

text = Path('README.md').read_text()
parts = [p.strip('\n') for p in re.split(r'\n(?=## )', text) if p.strip()]
cells = [{'cell_type': 'markdown', 'id': hashlib.sha1(f'index:{i}'.encode()).hexdigest()[:8], 'metadata': {}, 'source': p}
         for i, p in enumerate(parts)]
nb = {'cells': cells, 'metadata': {'kernelspec': {'display_name': 'python3', 'language': 'python', 'name': 'python3'}},
      'nbformat': 4, 'nbformat_minor': 5}
Path('nbs/index.ipynb').write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')
