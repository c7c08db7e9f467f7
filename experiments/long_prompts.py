"""``python -m experiments.long_prompts OUT_DIR [--tokens N]``: the embedded default's prompts, each
with a system preamble that brings it to about N tokens (chat template included) -- a bench workload with balanced
rounds.

Why: on two CPU cores the rollout of the embedded default's 13-token prompts takes 1.4-2.0x the training of the
same round (docs/results.md), so the trainer waits at least a third of every round whatever the schedule. Training
cost grows with every token of a sequence, the rollout's mostly with decode steps (a prompt is one batched
prefill), so RLVR-sized prompts (a few hundred tokens) move a round towards the paper's balance. Then:

    python -m recipe.rolloutpipe.bench --quick data.train_files=OUT_DIR/train.parquet \\
        data.val_files=OUT_DIR/val.parquet data.max_prompt_length=<printed> rolloutpipe.bench.out_dir=...
"""

from __future__ import annotations

import argparse
from pathlib import Path

PREAMBLE = ("You are a careful calculator. Read the problem, work it out step by step, check every partial result "
            "twice, and then reply with the number only. ")


def _prompt_tokens(tokenizer, messages: list[dict]) -> int:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tokenizer(text)["input_ids"])


def write_long_prompts(out: Path, tokens: int, source: Path | None = None) -> dict[str, int]:
    """``source``'s (default: the embedded default's) train/val parquet files into ``out`` with a system message of
    ``PREAMBLE`` text cut to the token count that brings each prompt to about ``tokens``. Returns the shortest and
    longest prompt (tokens) and the ``data.max_prompt_length`` to run them with."""
    import pandas as pd
    from transformers import AutoTokenizer

    from recipe.rolloutpipe.prepare import default_dir

    source = source or default_dir()
    tokenizer = AutoTokenizer.from_pretrained(source / "model")
    pool = tokenizer(PREAMBLE * (tokens // 8 + 1))["input_ids"]  # more preamble tokens than any prompt needs
    out.mkdir(parents=True, exist_ok=True)
    lengths = []
    for split in ("train", "val"):
        frame = pd.read_parquet(source / f"{split}.parquet")
        base = _prompt_tokens(tokenizer, [{"role": "system", "content": ""}, *frame["prompt"].iloc[0]])
        if base >= tokens:
            raise ValueError(f"long_prompts: --tokens {tokens} is not above the prompts' own length ({base})")
        system = {"role": "system", "content": tokenizer.decode(pool[: tokens - base]).strip()}
        frame["prompt"] = [[system, *messages] for messages in frame["prompt"]]
        frame.to_parquet(out / f"{split}.parquet")
        lengths += [_prompt_tokens(tokenizer, list(m)) for m in frame["prompt"].iloc[:64]]
    longest = max(lengths)
    return {"min_tokens": min(lengths), "max_tokens": longest, "max_prompt_length": 32 * (longest // 32 + 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.long_prompts",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="directory for train.parquet and val.parquet")
    ap.add_argument("--tokens", type=int, default=220, help="about this many tokens per prompt (default 220)")
    args = ap.parse_args(argv)
    info = write_long_prompts(args.out, args.tokens)
    print(f"[rolloutpipe] {args.out}/{{train,val}}.parquet: prompts of {info['min_tokens']}-{info['max_tokens']} "
          f"tokens; run with data.max_prompt_length={info['max_prompt_length']}")


if __name__ == "__main__":
    main()
