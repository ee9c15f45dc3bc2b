"""Builds the presets' bundled tokenizer (``data/tokenizer-bundled.json``), offline.

A byte-level BPE (GPT-2's byte alphabet, so any text encodes and ids decode back to bytes) of
4096 ids — the ``tiny`` preset's vocabulary, and within every preset's — trained with the
``tokenizers`` library on gpuchef's own English and Python text (README, docs, engine source),
so that a text prompt becomes a realistic number of tokens (~4 characters each). Ids 0–4 are
``<unk> <s> </s> <|im_start|> <|im_end|>`` (BOS 1 and EOS 2, as the ``tiny`` preset has them);
encoding adds ``<s>`` first, as Llama's tokenizers do.

Run from the repository root: ``python -m gpuchef.engine_host.vocab.bundled_tokenizer``. Training is
deterministic for the same text; the JSON is committed, so nothing is built at run time.
"""

from __future__ import annotations

from pathlib import Path

from .tokenizer import BUNDLED_PATH, BUNDLED_SPECIALS

VOCAB_SIZE = 4096


def corpus(root: Path) -> list[str]:
    files = [root / "README.md", *sorted((root / "docs").glob("*.md")),
             *sorted((root / "engine_host").rglob("*.py"))]  # vocab/ included
    return [p.read_text(encoding="utf-8") for p in files if p.is_file()]


def build(root: Path, out: Path = BUNDLED_PATH) -> int:
    """Train on ``root``'s text and write ``out``. Returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(BUNDLED_SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(root), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return tok.get_vocab_size(with_added_tokens=True)


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[2]
    n = build(root)
    print(f"wrote {BUNDLED_PATH} ({n} ids, {BUNDLED_PATH.stat().st_size / 1024:.0f} KiB)")
