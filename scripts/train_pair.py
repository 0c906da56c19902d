"""Train the matched Post-LN / Pre-LN pair of small causal language models (issue 12).

Both models read the same text (Python's own ``pydoc_data.topics``, the help text that ships
with CPython, about 465 kB of English), with the same byte-level BPE tokenizer (1024 tokens,
trained here), the same sizes (4 layers, 4 heads, d = 128, d_ff = 512, 64 positions), the
same activation (GELU-tanh), the same seed, batches, optimiser and schedule. They differ in
where the LayerNorm sits:

* ``pydoc-postln``: a Post-LN decoder, saved as a Hugging Face ``BertLMHeadModel``
  (``is_decoder: true``, so causal), ``Z1 = LN(X + SA(X))``, ``Z = LN(Z1 + FFN(Z1))``;
* ``pydoc-preln``: a Pre-LN decoder, saved as a ``GPT2LMHeadModel``,
  ``Z1 = X + SA(LN(X))``, ``Z = Z1 + FFN(LN(Z1))``, with GPT-2's final LayerNorm.

The two formats bring their own small extras (BERT's embedding LayerNorm and token-type row
and its LM-head transform; GPT-2's final ``ln_f``), so each is a standard checkpoint that
``transformers`` and :func:`hessviz.load_layer` both open. Loss: next-token cross-entropy.

Run (about 13 minutes for 1200 steps, the two models side by side on one thread each; it
writes ``hessviz/data/models/pydoc-{postln,preln}`` with ``model.safetensors``, ``config.json``,
``tokenizer.json`` and ``train.log``)::

    nice -n 19 python scripts/train_pair.py --steps 1200

``pydoc-llama`` (issue 19) is a third model of the same recipe in today's decoder style, saved as a
Hugging Face ``LlamaForCausalLM``: RMSNorm (ε = 1e-5), SwiGLU (d_ff = 352, so that its three
matrices hold about as many weights as the pair's two of 512), rotary positions (θ = 10000),
grouped-query attention (4 query heads, 2 key/value heads), no biases, tied embeddings. Llama has
no dropout on its residual branches, only on the attention probabilities (0.1, as the pair's).
Train it alone with ``--models llama``; the bundled one took 1000 steps (about 4 minutes of CPU
time by ``ps``, 19 minutes on the clock on a loaded shared machine)::

    nice -n 19 python scripts/train_pair.py --models llama --steps 1000

Needs ``transformers`` (the ``test`` extra); hessviz itself does not.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "hessviz" / "data" / "models"
VOCAB, D, LAYERS, HEADS, D_FF, POSITIONS = 1024, 128, 4, 4, 512, 64
KV_HEADS, D_FF_GATED = 2, 352
"""pydoc-llama: key/value heads and the SwiGLU width (3 · 128 · 352 ≈ 2 · 128 · 512 weights)."""
KINDS = ("postln", "preln", "llama")
SEED, BATCH, LR, WARMUP, WEIGHT_DECAY, DROPOUT = 0, 16, 1e-3, 60, 0.01, 0.1
EOS = "<|endoftext|>"


def corpus() -> list[str]:
    """The help topics of ``pydoc_data.topics``, sorted by name."""
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def token_stream(tok, texts: list[str]) -> torch.Tensor:
    """Every topic's ids, each followed by the end-of-text token, as one long stream."""
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for text in texts:
        ids += tok.encode(text).ids + [eos]
    return torch.tensor(ids)


def make_model(kind: str):
    import transformers as T

    if kind == "postln":
        config = T.BertConfig(
            vocab_size=VOCAB,
            hidden_size=D,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=D_FF,
            hidden_act="gelu_new",
            max_position_embeddings=POSITIONS,
            type_vocab_size=1,
            layer_norm_eps=1e-5,
            hidden_dropout_prob=DROPOUT,
            attention_probs_dropout_prob=DROPOUT,
            is_decoder=True,
            pad_token_id=None,
            bos_token_id=0,
            eos_token_id=0,
            tie_word_embeddings=True,
        )
        return T.BertLMHeadModel(config)
    if kind == "llama":
        config = T.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=D,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            intermediate_size=D_FF_GATED,
            hidden_act="silu",
            max_position_embeddings=POSITIONS,
            rms_norm_eps=1e-5,
            attention_dropout=DROPOUT,
            attention_bias=False,
            mlp_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=None,
            tie_word_embeddings=True,
        )
        return T.LlamaForCausalLM(config)
    config = T.GPT2Config(
        vocab_size=VOCAB,
        n_embd=D,
        n_layer=LAYERS,
        n_head=HEADS,
        n_inner=D_FF,
        activation_function="gelu_new",
        n_positions=POSITIONS,
        layer_norm_epsilon=1e-5,
        resid_pdrop=DROPOUT,
        embd_pdrop=DROPOUT,
        attn_pdrop=DROPOUT,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=True,
    )
    return T.GPT2LMHeadModel(config)


def batches(stream: torch.Tensor, steps: int, gen: torch.Generator):
    """``steps`` batches of ``BATCH`` random windows of ``POSITIONS`` tokens."""
    for _ in range(steps):
        starts = torch.randint(0, len(stream) - POSITIONS, (BATCH,), generator=gen)
        yield torch.stack([stream[s : s + POSITIONS] for s in starts.tolist()])


def evaluate(model, stream: torch.Tensor) -> float:
    """Mean next-token cross-entropy over consecutive windows of the held-out stream."""
    model.eval()
    windows = stream[: len(stream) // POSITIONS * POSITIONS].reshape(-1, POSITIONS)
    with torch.no_grad():
        losses = [model(input_ids=w, labels=w).loss.item() for w in windows.split(BATCH)]
    model.train()
    return sum(losses) / len(losses)


def train(kind: str, steps: int, tok_path: str, train_ids: torch.Tensor, val_ids: torch.Tensor) -> None:
    import transformers as T
    from tokenizers import Tokenizer

    torch.set_num_threads(1)
    T.utils.logging.disable_progress_bar()
    T.set_seed(SEED)
    torch.manual_seed(SEED)
    model = make_model(kind)
    model.train()
    embeddings = ("embeddings", "wte", "wpe", "embed_tokens")
    decay = [p for n, p in model.named_parameters() if p.ndim == 2 and not any(e in n for e in embeddings)]
    rest = [p for p in model.parameters() if all(p is not q for q in decay)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0.0}],
        lr=LR,
        betas=(0.9, 0.98),
    )

    def lr_at(step: int) -> float:
        if step < WARMUP:
            return LR * (step + 1) / WARMUP
        return LR * 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / max(1, steps - WARMUP)))

    folder = OUT / f"pydoc-{kind}"
    folder.mkdir(parents=True, exist_ok=True)
    n_params = sum(p.numel() for p in model.parameters())
    llama = kind == "llama"
    heads, d_ff = (f"{HEADS} heads ({KV_HEADS} key/value)", D_FF_GATED) if llama else (f"{HEADS} heads", D_FF)
    log = [
        f"# {folder.name}: {type(model).__name__}, {n_params} parameters, {LAYERS} layers, {heads}, "
        f"d = {D}, d_ff = {d_ff}, vocab {VOCAB}, {POSITIONS} positions",
        f"# data: pydoc_data.topics, {len(train_ids)} training and {len(val_ids)} held-out tokens; "
        f"batch {BATCH} x {POSITIONS}, AdamW lr {LR} (warm-up {WARMUP}, cosine), weight decay "
        f"{WEIGHT_DECAY}, dropout {DROPOUT}, seed {SEED}, torch {torch.__version__}, 1 thread",
        f"# command: nice -n 19 python scripts/train_pair.py --steps {steps}"
        + (" --models llama" if kind == "llama" else " (both models side by side)"),
        f"step 0 val_loss {evaluate(model, val_ids):.4f}",
    ]
    print(log[-1], flush=True)
    gen = torch.Generator().manual_seed(SEED)
    started, running = time.perf_counter(), []
    for step, batch in enumerate(batches(train_ids, steps, gen), start=1):
        for group in opt.param_groups:
            group["lr"] = lr_at(step - 1)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running.append(loss.item())
        if step % 50 == 0 or step == steps:
            line = (
                f"step {step} train_loss {sum(running) / len(running):.4f} "
                f"val_loss {evaluate(model, val_ids):.4f} lr {lr_at(step - 1):.2e} "
                f"elapsed {time.perf_counter() - started:.0f} s"
            )
            running = []
            log.append(line)
            print(f"[{kind}] {line}", flush=True)
    model.eval()
    model.save_pretrained(folder)
    for extra in ("generation_config.json",):
        (folder / extra).unlink(missing_ok=True)
    Tokenizer.from_file(tok_path).save(str(folder / "tokenizer.json"))
    (folder / "train.log").write_text("\n".join(log) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument(
        "--models",
        nargs="+",
        choices=KINDS,
        default=["postln", "preln"],
        help="which models to train (default the pair; llama: pydoc-llama)",
    )
    args = parser.parse_args()
    texts = corpus()
    tok = train_tokenizer(texts)
    OUT.mkdir(parents=True, exist_ok=True)
    tok_path = str(OUT / "tokenizer.tmp.json")
    tok.save(tok_path)
    stream = token_stream(tok, texts)
    cut = int(0.95 * len(stream))
    train_ids, val_ids = stream[:cut], stream[cut:]
    ctx = mp.get_context("spawn")  # the two models train side by side, one thread each
    procs = [
        ctx.Process(target=train, args=(kind, args.steps, tok_path, train_ids, val_ids))
        for kind in args.models
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    Path(tok_path).unlink()
    if any(p.exitcode for p in procs):
        raise SystemExit("training failed")


if __name__ == "__main__":
    main()
