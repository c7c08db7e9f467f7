"""The recipe drops into verl's recipe tree: copied into a ``recipe/`` package beside another recipe, its entry
points import from there (not from this checkout) and its Hydra config composes."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_recipe_runs_from_a_recipe_tree_beside_another_recipe(tmp_path):
    tree = tmp_path / "verl_recipes"
    (tree / "recipe" / "dapo").mkdir(parents=True)
    (tree / "recipe" / "__init__.py").write_text("")
    (tree / "recipe" / "dapo" / "__init__.py").write_text("")
    (tree / "recipe" / "dapo" / "main_dapo.py").write_text("NAME = 'dapo'\n")
    shutil.copytree(ROOT / "recipe" / "rolloutpipe", tree / "recipe" / "rolloutpipe",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = textwrap.dedent(f"""
        import recipe.dapo.main_dapo as dapo
        import recipe.rolloutpipe.main as main
        import recipe.rolloutpipe.verify_onpolicy, recipe.rolloutpipe.curves, recipe.rolloutpipe.sim.__main__
        import recipe.rolloutpipe.bench.__main__
        from recipe.rolloutpipe.prepare import default_dir
        from hydra import compose, initialize_config_dir
        assert main.__file__.startswith({str(tree)!r}), main.__file__
        with initialize_config_dir(config_dir=main.CONFIG_DIR, version_base=None):
            cfg = compose(config_name="rolloutpipe", overrides=["rolloutpipe.mode=cgp"])
        print(dapo.NAME, cfg.rolloutpipe.mode, cfg.algorithm.adv_estimator, default_dir().is_relative_to({str(tree)!r}))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-4:] == ["dapo", "cgp", "grpo", "True"]
