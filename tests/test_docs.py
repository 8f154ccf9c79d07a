"""The README as a front door and the docs it links: every relative link resolves, the
two set-up commands come first, and no file cites a design document outside the
repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code is not links
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    head = "\n".join(lines[:40])
    assert "pip install torch==2.13.0 -e . && python run_bench.py" in head
    assert "pip install torch==2.13.0 -e '.[dev]' && python -m pytest -q" in head
    # Every docs page is linked from it.
    readme = "\n".join(lines)
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in readme, page.name


def test_no_file_cites_a_design_document_outside_the_repository() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    files = [ROOT / f for f in tracked.stdout.splitlines()] if tracked.returncode == 0 \
        else [p for p in ROOT.rglob("*") if ".git" not in p.parts]
    cited = []
    for path in files:
        if not path.is_file() or path.suffix not in (".py", ".md", ".yml", ".toml", "") \
                or "results" in path.relative_to(ROOT).parts[:1]:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if "DESIGN" + ".md" in text or re.search(r"DESIGN section \d", text):
            cited.append(str(path.relative_to(ROOT)))
    assert not cited, cited
