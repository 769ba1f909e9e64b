"""Build a tiny Llama with a byte-level BPE tokenizer and a chat template, offline (no hub, no downloads).

Runs as a script under the vLLM venv's python (which has torch, transformers and tokenizers); knobfleet's own
venv never imports it. Everything is seeded, so the weights, the tokenizer and so greedy outputs are the same
on every machine with the same library versions::

    VENV/bin/python vllm_tiny_model.py OUT_DIR

The model is random: it produces deterministic gibberish, which is all the lab needs (a real engine
process tree, real knobs, real endpoints, and outputs that a consistency check can compare).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

SEED = 1234
VOCAB_SIZE = 512
HIDDEN = 128
LAYERS = 2
HEADS = 4
INTERMEDIATE = 256
MAX_POSITIONS = 2048

BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# Local training text for the tokenizer: fixed here so the vocabulary never depends on the machine.
_CORPUS = """\
Beautiful is better than ugly. Explicit is better than implicit. Simple is better than complex.
Complex is better than complicated. Flat is better than nested. Sparse is better than dense.
Readability counts. Special cases aren't special enough to break the rules. Although practicality beats purity.
Errors should never pass silently. Unless explicitly silenced. In the face of ambiguity, refuse the temptation
to guess. There should be one and preferably only one obvious way to do it. Now is better than never.
The quick brown fox jumps over the lazy dog. A knob profile sets environment variables and launch flags
for an inference engine; the fleet applies it host by host, waits for readiness and verifies the live process.
The scheduler batches requests, the kernel splits the context, and the engine streams tokens back to the client.
Hello, how are you today? I am a tiny model that answers with deterministic words. What is the capital of France?
Count from one to ten: one two three four five six seven eight nine ten. 0 1 2 3 4 5 6 7 8 9 10 100 1000.
user assistant system: You are a helpful assistant. Tell me a story about a fleet of GPUs and their knobs.
"""


def _mod(name: str) -> Any:
    return importlib.import_module(name)


def build_tokenizer() -> Any:
    tk = _mod("tokenizers")
    tok = tk.Tokenizer(tk.models.BPE(unk_token=None))
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=[BOS, EOS, PAD, UNK, "<|system|>", "<|user|>", "<|assistant|>"],
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([line for line in _CORPUS.splitlines() if line] * 4, trainer=trainer)
    tf = _mod("transformers")
    return tf.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
    )


def build(out: Path) -> dict[str, Any]:
    torch = _mod("torch")
    tf = _mod("transformers")
    torch.manual_seed(SEED)
    tokenizer = build_tokenizer()
    config = tf.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = tf.LlamaForCausalLM(config)
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    # A greedy sample, recorded so a server's output can be compared with plain HF generate.
    prompt = "Hello, how are you"
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    sample = {
        "prompt": prompt,
        "max_tokens": 8,
        "greedy_token_ids": [int(t) for t in gen[0][ids.shape[1] :]],
        "greedy_text": tokenizer.decode(gen[0][ids.shape[1] :]),
    }
    (out / "knobfleet_sample.json").write_text(json.dumps(sample, indent=1, sort_keys=True) + "\n")
    return sample


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: vllm_tiny_model.py OUT_DIR", file=sys.stderr)
        return 2
    sample = build(Path(argv[0]))
    print(json.dumps(sample, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
