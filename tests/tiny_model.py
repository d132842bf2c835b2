"""A tiny random-weight chat model built in-process, for fast tests of the transformers backend.

Nothing is downloaded: a byte-level BPE tokenizer is trained on a few sentences, wrapped as a
``PreTrainedTokenizerFast`` with a ChatML-like template, and paired with a 2-layer
``LlamaForCausalLM``. Both are saved to a folder so the backend's real loading code runs.
Its replies are noise; only a constrained reply is guaranteed to be well formed.
"""

from __future__ import annotations

from pathlib import Path

from hybridmem_local.config import LLMConfig

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)

TRAINING_TEXT = [
    'Caroline went to the LGBTQ support group on 7 May 2023. {"title": "Support group", "done": true}',
    "Melanie painted a sunrise over the lake last year and plans to run a charity race.",
    '{"entity": "Melanie", "relation": "painted", "object": "a sunrise", "kind": "a", "ok": false}',
    "What did Caroline research? Adoption agencies. Summarise the session in JSON: [1, 2, 3]",
    "The quick brown fox jumps over the lazy dog 0123456789 <think> </think> {} [] : , \" '",
]


def build_tiny_model(folder: Path, seed: int = 0) -> Path:
    """Write a tiny tokenizer + model to ``folder`` and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(TRAINING_TEXT, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|bos|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|im_start|>", "<|eos|>"],
        chat_template=CHAT_TEMPLATE,
    )
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_llm_config(**overrides) -> LLMConfig:
    return LLMConfig(backend="transformers", model="tiny-random-llama", context_tokens=1024, **overrides)


def tiny_transformers_llm(folder: Path, **overrides):
    """A transformers backend over the tiny model in ``folder`` (built there if missing)."""
    from hybridmem_local.llm import build_llm

    if not (folder / "config.json").exists():
        build_tiny_model(folder)
    return build_llm(tiny_llm_config(**overrides), model_path=folder)
