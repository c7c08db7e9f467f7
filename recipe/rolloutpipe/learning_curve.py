"""The learning curve of a run: training reward per round and greedy validation, as a PNG and its JSON.

The main job draws it once at the end of the run (``<rolloutpipe.timeline_dir>/learning_curve.png``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def write_learning_curve(round_rewards: Sequence[float], val_scores: Sequence[tuple[int, float]], out_dir: str | Path,
                         title: str = "") -> Path:
    """``round_rewards[i]``: mean training reward of round i+1; ``val_scores``: (rounds done, greedy validation
    score). Writes ``learning_curve.json`` and ``learning_curve.png`` into ``out_dir``; returns the PNG's path."""
    import matplotlib  # lazy: only the end of a run needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "learning_curve.json").write_text(json.dumps(
        {"round_rewards": list(round_rewards), "val_scores": [list(v) for v in val_scores]}, indent=1))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    rounds = range(1, len(round_rewards) + 1)
    ax.plot(rounds, round_rewards, color="tab:blue", alpha=0.45, lw=1, label="training reward (sampled, per round)")
    window = 5  # a trailing mean: one round is 16 prompts, so a single round's reward is noisy
    smooth = [sum(round_rewards[max(0, i - window + 1): i + 1]) / len(round_rewards[max(0, i - window + 1): i + 1])
              for i in range(len(round_rewards))]
    ax.plot(rounds, smooth, color="tab:blue", lw=2, label=f"training reward, mean of last {window} rounds")
    if val_scores:
        ax.plot([r for r, _ in val_scores], [s for _, s in val_scores], "o-", color="tab:red", lw=2,
                label="greedy validation (held-out prompts)")
    ax.set_xlabel("round (optimizer steps published)")
    ax.set_ylabel("exact-answer reward")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(title or "learning curve", fontsize=10)
    fig.tight_layout()
    path = out / "learning_curve.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
