"""Pre-flight check of the RL parquet files, before Ray or any worker starts.

verl's ``RLHFDataset`` fails on a malformed row or an overlong prompt only when the dataloader reaches it, which in
a long run is minutes or hours in, mid-round. This check reads every row once up front:

- malformed rows (no ``prompt`` list of ``{role, content}`` messages, no ``reward_model.ground_truth``, no
  ``data_source``): ``rolloutpipe.data_check.on_bad_row=error`` stops with one message naming the file, the rows
  and the key; ``skip`` writes a cleaned copy without them (counted and reported) and trains on that;
- prompts longer than ``data.max_prompt_length`` tokens (chat template applied, as verl does): an error naming the
  rows and the three fixes, unless verl already handles them (``data.filter_overlong_prompts=true`` drops them,
  ``data.truncation`` left/right/middle cuts them); then only counted and reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class DataCheckError(ValueError):
    pass


@dataclass
class DataReport:
    path: str
    rows: int
    bad_rows: dict[int, str] = field(default_factory=dict)  # row -> what is wrong
    overlong_rows: dict[int, int] = field(default_factory=dict)  # row -> prompt tokens


def row_problem(row: dict[str, Any], prompt_key: str) -> str | None:
    """What makes a verl RL row unusable, or None."""
    prompt = row.get(prompt_key)
    if prompt is None or isinstance(prompt, str) or not hasattr(prompt, "__len__") or len(prompt) == 0:
        return f"'{prompt_key}' must be a non-empty list of chat messages, got {type(prompt).__name__}"
    for m in prompt:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return f"'{prompt_key}' messages need string 'role' and 'content', got {m!r:.80}"
    rm = row.get("reward_model")
    if not isinstance(rm, dict) or rm.get("ground_truth") is None:
        return "'reward_model.ground_truth' is missing (the reward function needs it)"
    if not isinstance(row.get("data_source"), str):
        return "'data_source' is missing"
    return None


def check_file(path: str, tokenizer, max_prompt_length: int, prompt_key: str = "prompt") -> DataReport:
    import pandas as pd

    try:
        frame = pd.read_parquet(path)
    except Exception as e:  # any reader error means the same thing to the user
        raise DataCheckError(f"cannot read {path} as parquet ({type(e).__name__}: {str(e)[:200]}): the file is "
                             "truncated, corrupt or not parquet; rebuild it") from None
    report = DataReport(path=path, rows=len(frame))
    for i, row in enumerate(frame.to_dict("records")):
        if (problem := row_problem(row, prompt_key)) is not None:
            report.bad_rows[i] = problem
            continue
        ids = tokenizer.apply_chat_template(list(row[prompt_key]), add_generation_prompt=True, tokenize=True)
        n = len(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        if n > max_prompt_length:
            report.overlong_rows[i] = n
    return report


def _rows(d: dict, n: int = 5) -> str:
    items = list(d.items())[:n]
    return ", ".join(f"row {i}: {v}" for i, v in items) + (f" (and {len(d) - n} more)" if len(d) > n else "")


def check_data(config, out_dir: str | Path) -> list[DataReport]:
    """Check train and val files; apply the bad-row policy (may repoint ``data.*_files`` at cleaned copies)."""
    from omegaconf import open_dict
    from transformers import AutoTokenizer

    policy = config.rolloutpipe.data_check.on_bad_row
    if policy not in ("error", "skip"):
        raise DataCheckError(f"rolloutpipe: rolloutpipe.data_check.on_bad_row={policy!r}: use error or skip")
    data = config.data
    tokenizer = AutoTokenizer.from_pretrained(config.actor_rollout_ref.model.path)
    max_len = int(data.max_prompt_length)
    verl_handles_overlong = bool(data.get("filter_overlong_prompts", False)) or data.get("truncation") != "error"
    reports = []
    for key in ("train_files", "val_files"):
        files = data[key] if not isinstance(data[key], str) else [data[key]]
        cleaned = []
        for path in files:
            try:
                rep = check_file(str(path), tokenizer, max_len, data.get("prompt_key", "prompt"))
            except DataCheckError as e:
                raise DataCheckError(f"rolloutpipe: data.{key}: {e}") from None
            reports.append(rep)
            if rep.rows == 0:
                raise DataCheckError(f"rolloutpipe: data.{key}: {path} has no rows")
            if rep.bad_rows and policy == "error":
                raise DataCheckError(
                    f"rolloutpipe: data.{key}: {path} has {len(rep.bad_rows)} malformed rows -- {_rows(rep.bad_rows)}. "
                    "Fix the data, or set rolloutpipe.data_check.on_bad_row=skip to train without them.")
            if rep.overlong_rows and not verl_handles_overlong:
                raise DataCheckError(
                    f"rolloutpipe: data.{key}: {path} has {len(rep.overlong_rows)} prompts longer than "
                    f"data.max_prompt_length={max_len} tokens -- {_rows(rep.overlong_rows)} tokens. Raise "
                    "data.max_prompt_length, or set data.filter_overlong_prompts=true (drop them) or "
                    "data.truncation=left (cut them).")
            if rep.bad_rows:  # policy skip: a cleaned copy without them
                import pandas as pd

                out = Path(out_dir) / f"{Path(path).stem}.clean.parquet"
                out.parent.mkdir(parents=True, exist_ok=True)
                frame = pd.read_parquet(path)
                frame.drop(index=frame.index[list(rep.bad_rows)]).reset_index(drop=True).to_parquet(out)
                cleaned.append(str(out))
            else:
                cleaned.append(str(path))
        with open_dict(config):
            data[key] = cleaned if not isinstance(data[key], str) else cleaned[0]
    return reports


def summary(reports: list[DataReport]) -> str:
    parts = [f"{Path(r.path).name}: {r.rows} rows, {len(r.bad_rows)} skipped as malformed, "
             f"{len(r.overlong_rows)} overlong" for r in reports]
    return "[rolloutpipe] data check: " + "; ".join(parts)
