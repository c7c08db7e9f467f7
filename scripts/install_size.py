"""How big an install of one of the package's extras is, without installing it: ``python scripts/install_size.py gpu``.

pip resolves ``.[EXTRA]`` against the configured index (``--dry-run --report``); every resolved wheel is then fetched
(or read from a local index) and its size and unpacked size (the sum of its zip entries) added up. Prints one JSON
object: packages, download_gb, unpacked_gb, the largest ten packages.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def resolve(extra: str, report: Path) -> list[dict]:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "--quiet", "--dry-run",
                    "--ignore-installed", "--report", str(report), f"{ROOT}[{extra}]"], check=True)
    return json.loads(report.read_text())["install"]


def sizes(item: dict, scratch: Path) -> tuple[str, int, int]:
    """(name, download bytes, unpacked bytes) of one resolved distribution; the project itself counts 0."""
    name, url = item["metadata"]["name"], item["download_info"]["url"]
    if url.startswith("file://"):
        path = Path(urllib.parse.unquote(url[len("file://"):]))
        if not path.is_file():  # a directory: this project
            return name, 0, 0
        return name, path.stat().st_size, _unpacked(path)
    with tempfile.NamedTemporaryFile(dir=scratch, suffix=Path(url).suffix) as tmp:
        with urllib.request.urlopen(url, timeout=600) as r:
            shutil.copyfileobj(r, tmp, 1 << 20)
        tmp.flush()
        return name, os.path.getsize(tmp.name), _unpacked(Path(tmp.name))


def _unpacked(path: Path) -> int:
    if not zipfile.is_zipfile(path):  # an sdist: count its download size
        return path.stat().st_size
    with zipfile.ZipFile(path) as z:
        return sum(f.file_size for f in z.infolist())


def main(extra: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        items = resolve(extra, Path(tmp) / "report.json")
        with ThreadPoolExecutor(6) as pool:
            rows = list(pool.map(lambda i: sizes(i, Path(tmp)), items))
    rows.sort(key=lambda r: -r[2])
    return {"extra": extra, "packages": len(rows), "download_gb": round(sum(r[1] for r in rows) / 1e9, 2),
            "unpacked_gb": round(sum(r[2] for r in rows) / 1e9, 2),
            "largest_unpacked_gb": {n: round(u / 1e9, 2) for n, _, u in rows[:10]}}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "gpu"), indent=1))
