"""A tiny random-weight PaliGemma (SigLIP vision tower + Gemma text model) that vLLM serves on a CPU, built offline.

It exists to test the kit's image path end to end (`tests/test_vllm_vision.py`): frames sent as `image_url` parts
reach a real vLLM server, which turns each image into `IMAGE_TOKENS` placeholder tokens that its `usage` counts.
The weights are random (seed 0), so replies are meaningless: tests may assert protocol and accounting, never content.

Why PaliGemma: with transformers 5.x and no torchvision, vLLM's Qwen2-VL, Gemma-3, LLaVA and Llama-4 modules fail
to import (their transformers image processors import torchvision); PaliGemma only needs SigLIP, whose image
processor has a PIL backend. vLLM's PaliGemma takes at most one image per prompt.

Usage (in `.venv-vllm`, which has torch, transformers, tokenizers and safetensors; nothing is downloaded):

    python tools/tiny_vlm.py [OUT]     # default ~/.cache/reveal-kit/models/tiny-paligemma-v1

A folder is built once: `.complete` is written last, and a complete folder is left as it is.
"""
from __future__ import annotations
import os
import shutil
import sys
from pathlib import Path

RECIPE = 'v1'                          # raise when anything below changes: the default folder's name changes
DEFAULT_DIR = Path.home() / '.cache' / 'reveal-kit' / 'models' / f'tiny-paligemma-{RECIPE}'
IMAGE_SIZE, PATCH = 56, 14
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2          # 16 image tokens per image
TEXT_HIDDEN, MAX_POSITIONS = 128, 8192
MARKER = '.complete'
SPECIAL = ['<pad>', '<eos>', '<bos>', '<unk>', '<image>']
CORPUS = ["The quick brown fox jumps over the lazy dog.",
          "Describe the image. What color is it? It is red, green, blue.",
          'Return JSON: {"color": "red", "count": 3, "ok": true}',
          "caption en answer en detect segment",
          "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
          "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ \n\t"] * 20
# PaliGemma has no roles: the turns' texts are concatenated. vLLM inserts the image tokens itself, so image parts
# are skipped here.
CHAT_TEMPLATE = ("{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}"
                 "{% else %}{% for c in message['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
                 "{% endfor %}{% endif %}{% endfor %}")


def is_complete(out: str | Path) -> bool:
    "Whether `out` holds a finished build."
    return (Path(out) / MARKER).is_file()


def _processor():
    "A byte-level BPE tokenizer (400 tokens, trained on CORPUS) in a PaliGemma processor with the PIL SigLIP one."
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.paligemma.processing_paligemma import PaliGemmaProcessor
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil
    tok = Tokenizer(models.BPE(unk_token='<unk>'))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token='<bos>', eos_token='<eos>', pad_token='<pad>',
                                     unk_token='<unk>', extra_special_tokens={'image_token': '<image>'})
    hf_tok.add_tokens(['\n'])     # vLLM's PaliGemma looks up vocab["\n"]; byte-level BPE spells it "Ċ"
    img = SiglipImageProcessorPil(size={'height': IMAGE_SIZE, 'width': IMAGE_SIZE}, image_mean=[0.5] * 3,
                                  image_std=[0.5] * 3, image_seq_length=IMAGE_TOKENS)
    img.image_seq_length = IMAGE_TOKENS
    # the processor adds the <locXXXX>/<segXXX> tokens and turns the tokenizer's add_bos/add_eos off
    return PaliGemmaProcessor(image_processor=img, tokenizer=hf_tok, chat_template=CHAT_TEMPLATE)


def _model(tokenizer):
    "The PaliGemma model with random bf16 weights (seed 0), ids and vocabulary matching `tokenizer`."
    import torch
    from transformers import GemmaConfig, PaliGemmaConfig, PaliGemmaForConditionalGeneration, SiglipVisionConfig
    torch.manual_seed(0)
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    vocab = (len(tokenizer) + 63) // 64 * 64
    text = GemmaConfig(vocab_size=vocab, hidden_size=TEXT_HIDDEN, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=1, head_dim=32, max_position_embeddings=MAX_POSITIONS,
                       hidden_activation='gelu_pytorch_tanh', tie_word_embeddings=True, **ids)
    vision = SiglipVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=TEXT_HIDDEN,
                                vision_use_head=False)
    cfg = PaliGemmaConfig(vision_config=vision.to_dict(), text_config=text.to_dict(),
                          image_token_index=tokenizer.convert_tokens_to_ids('<image>'), projection_dim=TEXT_HIDDEN,
                          hidden_size=TEXT_HIDDEN, vocab_size=vocab, **ids)
    cfg.vision_config.projection_dim = TEXT_HIDDEN
    model = PaliGemmaForConditionalGeneration(cfg).to(torch.bfloat16)
    for k, v in ids.items(): setattr(model.generation_config, k, v)
    # A random model with tied embeddings echoes its last input token, and vLLM ends every PaliGemma image prompt
    # with "\n": its replies would be blank lines, which the kit rightly takes for empty. Make "\n" a shrunken "x",
    # so that the echo is a visible character.
    emb = model.get_input_embeddings().weight
    with torch.no_grad(): emb[tokenizer.convert_tokens_to_ids('\n')] = 0.9 * emb[tokenizer.convert_tokens_to_ids('x')]
    return model


def _rename_vision_keys(st: Path) -> None:
    """transformers 5.19 saves the vision weights as `vision_tower.embeddings…`; vLLM's SiglipVisionModel (like the
    hub checkpoints) loads `vision_tower.vision_model.…`: rename them in place."""
    from safetensors.torch import load_file, save_file
    pre, new = 'vision_tower.', 'vision_tower.vision_model.'
    sd = load_file(st)
    sd = {(new + k[len(pre):] if k.startswith(pre) and not k.startswith(new) else k): v for k, v in sd.items()}
    save_file(sd, st, metadata={'format': 'pt'})


def build(out: str | Path = DEFAULT_DIR) -> Path:
    "Build the model folder at `out` unless it is complete already (built beside it, then moved into place)."
    out = Path(out).expanduser()
    if is_complete(out): return out
    tmp = out.with_name(f'{out.name}.tmp{os.getpid()}')
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        proc = _processor()
        _model(proc.tokenizer).save_pretrained(tmp)
        proc.save_pretrained(tmp)
        _rename_vision_keys(tmp / 'model.safetensors')
        (tmp / MARKER).write_text(f'tiny-paligemma {RECIPE}: random weights, seed 0\n')
        shutil.rmtree(out, ignore_errors=True)       # an unfinished earlier build
        os.replace(tmp, out)
    finally: shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == '__main__':
    print(build(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_DIR))
