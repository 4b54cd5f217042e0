"""Packaging for reveal-kit, driven by settings.ini (nbdev 2 convention)."""
from configparser import ConfigParser
import setuptools

config = ConfigParser(delimiters=['='])
config.read('settings.ini', encoding='utf-8')
cfg = config['DEFAULT']
req = lambda key: cfg.get(key, '').split()

setuptools.setup(
    name=cfg['lib_name'], version=cfg['version'], description=cfg['description'],
    author=cfg['author'], author_email=cfg['author_email'], license=cfg['license'],
    packages=setuptools.find_packages(include=['reveal_kit', 'reveal_kit.*']),
    include_package_data=True, python_requires='>=' + cfg['min_python'],
    install_requires=req('requirements'),
    extras_require={'dev': req('dev_requirements'), 'embedded': req('embedded_requirements'),
                    'gpu': req('gpu_requirements'),
                    'clip': req('clip_requirements'), 'bge': req('bge_requirements'),
                    'ray': req('ray_requirements'), 'lmms': req('lmms_requirements')},
    entry_points={'console_scripts': req('console_scripts'),
                  'nbdev': [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"],
                  # lmms-eval finds the kit's agent as its model `reveal` (the `lmms` extra)
                  'lmms_eval.models': ['reveal=reveal_kit.eval.lmms:manifest']},
    zip_safe=False,
)
