"""Build the embedded default deterministically from a seed, with no download:

- a byte-level BPE tokenizer (digits split one per token) trained locally, with a ChatML chat template;
- a tiny Qwen3-architecture model (hidden 128, 2 layers, vocab 512, tied embeddings), fp32;
- a short supervised warm start on the arithmetic task, so that sampled groups of K answers disagree (GRPO needs
  non-zero reward variance inside a group to learn);
- verl RL parquet files (``prompt``, ``data_source``, ``reward_model.ground_truth``, ``extra_info``).

``task="arith_tool"`` builds the agentic variant: the same problems, but the warm start answers a share
(``tool_prob``) of them through the calculator tool (``<tool_call>{"name":"calc",...}</tool_call>``, the tool's
answer as a ``tool`` turn, then the final answer), as verl's ``ToolAgentLoop`` runs it. Direct answers of two-digit
problems are mostly wrong and the tool's are right, so RL learns to call the tool (config/task/agentic.yaml).

The default (``DefaultSpec()``) ships built in ``recipe/rolloutpipe/embedded/`` (≈ 2 MB, checksums in its
``SHA256SUMS``): floating-point kernels differ between CPU types, so a rebuild on another machine gives another
warm start (validation 0.42 on one machine, 0.69 on another, from the same seed), and every machine must train the
same start. ``python -m recipe.rolloutpipe.prepare --force`` rebuilds it into the cache (≈ 100 s on 2 cores) and
``--ship`` writes the rebuild into the repo; any other spec (``rolloutpipe.embedded_seed``) is built on first use
and cached (``~/.cache/rolloutpipe`` or ``$ROLLOUTPIPE_CACHE``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from .logs import get_logger

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
logger = get_logger("recipe.rolloutpipe.prepare")
BUILD_VERSION = 2  # bump when the recipe below changes: it keys the cache


@dataclass(frozen=True)
class DefaultSpec:
    seed: int = 0
    vocab_size: int = 512
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    train_prompts: int = 4096
    val_prompts: int = 256
    sft_steps: int = 2400
    sft_batch: int = 64
    sft_lr: float = 3e-3
    restate_prob: float = 0.6  # share of warm-start answers that restate the equation (task.demonstration)
    group_size: int = 8  # K used to report the reward-variance fraction
    task: str = "arith"  # or "arith_tool": the agentic variant (the calculator tool, several turns)
    tool_prob: float = 0.3  # arith_tool: share of warm-start answers that call the tool first

    def key(self) -> str:
        fields = asdict(self)
        if self.task == "arith":  # the single-turn default's key from before the agentic variant existed
            del fields["task"], fields["tool_prob"]
        blob = json.dumps({**fields, "build": BUILD_VERSION}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    @property
    def agentic(self) -> bool:
        return self.task == "arith_tool"


def cache_root() -> Path:
    return Path(os.environ.get("ROLLOUTPIPE_CACHE", Path.home() / ".cache" / "rolloutpipe"))


SHIPPED = Path(__file__).with_name("embedded")  # the single-turn default
SHIPPED_AGENTIC = Path(__file__).with_name("embedded_agentic")  # DefaultSpec(task="arith_tool")
MANIFEST = "SHA256SUMS"
TASKS = ("arith", "arith_tool")


def build_dir(spec: DefaultSpec = DefaultSpec()) -> Path:
    """Where a local build of ``spec`` goes (the cache)."""
    return cache_root() / f"default-{spec.key()}"


def shipped_dir(spec: DefaultSpec) -> Path:
    return SHIPPED_AGENTIC if spec.agentic else SHIPPED


def shipped_key(spec: DefaultSpec = DefaultSpec()) -> str | None:
    info = shipped_dir(spec) / "info.json"
    return json.loads(info.read_text()).get("key") if info.exists() else None


def default_dir(spec: DefaultSpec = DefaultSpec()) -> Path:
    """The shipped build when it is the one for ``spec``, else the cache's."""
    return shipped_dir(spec) if shipped_key(spec) == spec.key() else build_dir(spec)


def file_checksums(root: Path) -> dict[str, str]:
    """sha256 of every file below ``root`` but the manifest, by relative path."""
    return {str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(root.rglob("*")) if f.is_file() and f.name != MANIFEST}


def write_manifest(root: Path) -> None:
    (root / MANIFEST).write_text("".join(f"{h}  {name}\n" for name, h in file_checksums(root).items()))


def read_manifest(root: Path) -> dict[str, str]:
    return {name: h for h, name in (line.split("  ", 1) for line in (root / MANIFEST).read_text().splitlines())}


def _problems(seed: int, n: int) -> list[tuple[str, str]]:
    from .task import make_problem

    rng = random.Random(seed)
    return [make_problem(rng) for _ in range(n)]


def build_tokenizer(spec: DefaultSpec, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    corpus = [f"user\n{q}\nassistant\n{a}" for q, a in _problems(spec.seed + 1, 4000)]
    if spec.agentic:  # the tool turns too, so a call is a few tokens, not one per byte
        from .task import tool_call

        corpus += [f"user\n{q}\nassistant\n{tool_call(q)}\ntool\n{a}\nassistant\n{a}"
                   for q, a in _problems(spec.seed + 1, 2000)]
    corpus += ["system user assistant the answer is", "Compute the result and reply with the number only."]
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(spec: DefaultSpec, tokenizer):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(spec.seed)
    cfg = Qwen3Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.hidden_size // spec.num_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    return Qwen3ForCausalLM(cfg)


def _encode(tokenizer, question: str) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)


def tool_turn_ids(tokenizer, result: str) -> list[int]:
    """The tokens verl's ``ToolAgentLoop`` appends after a tool call ends with ``<|im_end|>``: the newline its Qwen
    ChatML builder inserts, the ``tool`` turn with the tool's answer and the next assistant header (masked out of
    the loss at run time, as here)."""
    newline = tokenizer.encode("\n", add_special_tokens=False)
    turn = tokenizer.apply_chat_template([{"role": "tool", "content": result}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)
    return newline + list(turn)


def _demonstration_ids(spec: DefaultSpec, tokenizer, q: str, a: str,
                       fmt: random.Random) -> list[tuple[list[int], bool]]:
    """The answer the warm start imitates, as (tokens, trained on?) spans after the prompt."""
    from .task import demonstration, evaluate, tool_call

    eos = tokenizer.eos_token_id
    if spec.agentic and fmt.random() < spec.tool_prob:
        call = tokenizer.encode(tool_call(q), add_special_tokens=False) + [eos]
        result = evaluate(q.removesuffix("="))
        return [(call, True), (tool_turn_ids(tokenizer, result), False),
                (tokenizer.encode(result, add_special_tokens=False) + [eos], True)]
    return [(tokenizer.encode(demonstration(q, a, fmt, spec.restate_prob), add_special_tokens=False) + [eos], True)]


def warm_start(spec: DefaultSpec, model, tokenizer) -> list[float]:
    """Supervised fine-tuning on the task; loss on the model's own tokens only (not the prompt, not a tool's
    answer). Returns the loss curve."""
    import torch

    torch.manual_seed(spec.seed)
    data = _problems(spec.seed + 2, spec.sft_steps * spec.sft_batch)
    fmt = random.Random(spec.seed + 4)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.sft_lr)
    model.train()
    losses = []
    for step in tqdm(range(spec.sft_steps), desc="warm start (SFT steps)", unit="step", mininterval=2):
        rows = []
        for q, a in data[step * spec.sft_batch : (step + 1) * spec.sft_batch]:
            seq = list(_encode(tokenizer, q))
            trained = [False] * len(seq)
            for ids, on in _demonstration_ids(spec, tokenizer, q, a, fmt):
                seq += ids
                trained += [on] * len(ids)
            rows.append((seq, trained))
        width = max(len(ids) for ids, _ in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id)
        labels = torch.full((len(rows), width), -100)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (seq, trained) in enumerate(rows):
            ids[i, : len(seq)] = torch.tensor(seq)
            on = torch.tensor(trained)
            labels[i, : len(seq)] = torch.where(on, torch.tensor(seq), torch.tensor(-100))
            mask[i, : len(seq)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def _tool_answers(model, tokenizer, q: str, k: int, sample: bool) -> list[str]:
    """K answers to ``q`` the way verl's ToolAgentLoop gets them (at most one tool call: generate; if the answer
    calls the calculator, append its ``tool`` turn and generate the final answer), decoded as verl's reward sees
    them (without special tokens)."""
    import torch

    from .task import evaluate

    gen = dict(do_sample=sample, max_new_tokens=40, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id, **(dict(temperature=1.0, top_k=0, top_p=1.0) if sample else {}))
    texts = []
    for _ in range(k):
        prompt = _encode(tokenizer, q)
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **gen)[0].tolist()
        text = tokenizer.decode(out[len(prompt):], skip_special_tokens=True)
        if "<tool_call>" in text and "</tool_call>" in text:
            expr = text.split('"expr":"', 1)[-1].split('"', 1)[0]
            ids = torch.tensor([out + tool_turn_ids(tokenizer, evaluate(expr))])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **gen)[0].tolist()
            text = tokenizer.decode(out[len(prompt):], skip_special_tokens=True)
        texts.append(text)
    return texts


def _answers(spec: DefaultSpec, model, tokenizer, q: str, k: int, sample: bool) -> list[str]:
    import torch

    if spec.agentic:
        return _tool_answers(model, tokenizer, q, k, sample)
    ids = torch.tensor([_encode(tokenizer, q)] * k)
    gen = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=8) if sample else \
        dict(do_sample=False, max_new_tokens=12)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **gen)
    return tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)


def reward_variance_fraction(spec: DefaultSpec, model, tokenizer, n_prompts: int = 64, k: int = 8,
                             seed: int = 0) -> dict[str, float]:
    """Sample K answers per prompt (temperature 1): the share of groups whose rewards are not all equal."""
    import torch

    from .task import DATA_SOURCE, TOOL_DATA_SOURCE, compute_score

    torch.manual_seed(seed)
    probs = _problems(seed + 3, n_prompts)
    mixed, correct, calls = 0, 0.0, 0
    source = TOOL_DATA_SOURCE if spec.agentic else DATA_SOURCE
    for q, a in probs:
        texts = _answers(spec, model, tokenizer, q, k, sample=True)
        calls += sum("<tool_call>" in t for t in texts)
        r = [compute_score(source, t, a) for t in texts]
        mixed += int(0 < sum(r) < k)
        correct += sum(r) / k
    stats = {"nonzero_variance_fraction": mixed / n_prompts, "mean_reward": correct / n_prompts}
    if spec.agentic:
        stats["tool_call_fraction"] = calls / (n_prompts * k)
    return stats


def greedy_reward(spec: DefaultSpec, model, tokenizer, n_prompts: int = 128, seed: int = 0) -> float:
    """Mean reward of greedy answers (what the run's validation measures), on fresh prompts."""
    import torch

    from .task import DATA_SOURCE, TOOL_DATA_SOURCE, compute_score

    hits = 0.0
    source = TOOL_DATA_SOURCE if spec.agentic else DATA_SOURCE
    with torch.no_grad():
        for q, a in _problems(seed + 5, n_prompts):
            hits += compute_score(source, _answers(spec, model, tokenizer, q, 1, sample=False)[0], a)
    return hits / n_prompts


def write_parquet(spec: DefaultSpec, out: Path) -> None:
    import pandas as pd

    from .task import DATA_SOURCE, TOOL_DATA_SOURCE

    for split, n, seed in (("train", spec.train_prompts, spec.seed + 10), ("val", spec.val_prompts, spec.seed + 11)):
        rows = [
            {
                "data_source": TOOL_DATA_SOURCE if spec.agentic else DATA_SOURCE,
                "prompt": [{"role": "user", "content": q}],
                "ability": "arithmetic",
                "reward_model": {"style": "rule", "ground_truth": a},
                "extra_info": {"split": split, "index": i},
            }
            for i, (q, a) in enumerate(_problems(seed, n))
        ]
        pd.DataFrame(rows).to_parquet(out / f"{split}.parquet")


def build(spec: DefaultSpec = DefaultSpec(), out: Path | None = None) -> Path:
    import torch

    out = out or build_dir(spec)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model_dir = tmp / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with torch.random.fork_rng():
        tokenizer = build_tokenizer(spec, model_dir)
        model = build_model(spec, tokenizer)
        losses = warm_start(spec, model, tokenizer)
        stats = reward_variance_fraction(spec, model, tokenizer, k=spec.group_size, seed=spec.seed)
        stats["greedy_reward"] = greedy_reward(spec, model, tokenizer, seed=spec.seed)
    model.save_pretrained(model_dir, safe_serialization=True)
    model.generation_config.save_pretrained(model_dir)
    write_parquet(spec, tmp)
    info = {"key": spec.key(), "spec": asdict(spec), "sft_final_loss": losses[-1],
            "build_s": round(time.time() - t0, 1), **stats}
    (tmp / "info.json").write_text(json.dumps(info, indent=1))
    if out.exists():  # another process won the race: keep theirs
        import shutil

        shutil.rmtree(tmp)
    else:
        tmp.rename(out)
    return out


def ensure_default(spec: DefaultSpec = DefaultSpec()) -> Path:
    """Path of the embedded default (model/, train.parquet, val.parquet, info.json), built on first use."""
    path = default_dir(spec)
    if not (path / "info.json").exists():
        logger.info(f"rolloutpipe: building the embedded default (tiny Qwen3 + arithmetic task) into {path} ...")
        build(spec, path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--task", choices=TASKS, default="arith", help="arith_tool: the agentic variant")
    ap.add_argument("--force", action="store_true", help="rebuild into the cache even if shipped or cached")
    ap.add_argument("--ship", action="store_true",
                    help=f"rebuild and write the build into {SHIPPED} (or {SHIPPED_AGENTIC.name}) with its {MANIFEST} "
                         "(commit it)")
    args = ap.parse_args()
    spec = DefaultSpec(seed=args.seed, task=args.task)
    if args.force or args.ship:
        import shutil

        shutil.rmtree(build_dir(spec), ignore_errors=True)
        logger.info(f"rolloutpipe: rebuilding the embedded default into {build_dir(spec)} ...")
        path = build(spec)
        if args.ship:
            shutil.rmtree(shipped_dir(spec), ignore_errors=True)
            shutil.copytree(path, shipped_dir(spec))
            write_manifest(shipped_dir(spec))
            path = shipped_dir(spec)
    else:
        path = ensure_default(spec)
    info = json.loads((path / "info.json").read_text())
    print(f"embedded default: {path}")
    print(f"  SFT final loss {info['sft_final_loss']:.3f}, sampled reward {info['mean_reward']:.3f}, "
          f"greedy reward {info.get('greedy_reward', float('nan')):.3f}, "
          f"groups of K={spec.group_size} with non-zero reward variance: {100 * info['nonzero_variance_fraction']:.0f}%"
          f" (built in {info['build_s']} s)")


if __name__ == "__main__":
    main()
