"""Sphinx configuration of the kit's site (built by `make docs`, i.e. `tools/build_site.py`, from the staged `_docsrc/`)."""
project = 'reveal-kit'
author = 'reveal-kit developers'
copyright = '2026 onwards, reveal-kit developers'

extensions = ['myst_nb']
myst_enable_extensions = ['colon_fence', 'deflist']
myst_heading_anchors = 3
suppress_warnings = ['myst.header', 'myst.xref_missing', 'misc.highlighting_failure', 'toc.not_included',
                     'mystnb.unknown_mime_type']
exclude_patterns = ['_build', '**.ipynb_checkpoints', 'jupyter_execute']

# Notebooks run at build time and are cached (tools/build_site.py passes the cache path); experiment notebooks
# rerun whole experiments, so their pages show the committed figures instead of running.
nb_execution_mode = 'cache'
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_execution_excludepatterns = ['experiments/*']
nb_merge_streams = True
# Offline at view time: no widget JavaScript from a CDN (widget outputs show their static HTML fallback), math written with $…$ stays as typed (no MathJax from a CDN).
nb_ipywidgets_js = {}
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]


html_theme = 'furo'
html_title = 'reveal-kit'
html_static_path = ['_static']          # custom.css: room for the kit's 100-column code
html_css_files = ['custom.css']
html_copy_source = False
html_show_sourcelink = False
