"""The README is a landing page whose two set-up commands come first and are the ones CI runs; every link in it and
in the guides resolves; the guides build as a site with `mkdocs build --strict`."""

import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_a_landing_page():
    assert len(README.splitlines()) <= 150
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    install, tests = blocks[0].strip(), blocks[1].strip()
    assert install == ('python3 -m pip install torch==2.13.0 && python3 -m pip install -e ".[all,dev]" && rlprof train')
    assert tests == "python3 -m pytest -q"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m pip install -q torch==2.13.0" in ci and 'python3 -m pip install -q -e ".[all,dev]"' in ci
    assert re.search(r"^python3 -m pytest -q$", ci, re.M), "CI runs the README's test command"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_and_picture_resolves(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    for target in targets:
        if re.match(r"[a-z]+://|#|mailto:", target):
            continue
        assert (page.parent / target.split("#")[0]).exists(), f"{page.name}: {target}"
    if page.name == "README.md":
        assert targets, "the README links to its guides"


def test_every_guide_is_in_the_site_and_it_builds_strict(tmp_path):
    mkdocs = shutil.which("mkdocs") or pytest.skip("mkdocs is not installed (the dev extra brings it)")
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [p.name for p in PAGES[1:] if p.name not in nav]
    assert not missing, f"docs pages not in mkdocs.yml's nav: {missing}"
    proc = subprocess.run(
        [mkdocs, "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "analysis_schema" / "index.html").exists()


def test_the_guides_build_fails_on_a_broken_link(tmp_path):
    """--strict is what keeps links from rotting: a page linking to a missing one fails the build (not with -q,
    which hides the warnings --strict counts)."""
    shutil.which("mkdocs") or pytest.skip("mkdocs is not installed (the dev extra brings it)")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\n[gone](missing.md)\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: x\nstrict: true\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(tmp_path / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "missing.md" in proc.stderr


def test_nothing_cites_a_document_outside_the_repository():
    """Docstrings, tests and guides point at what a reader of this repository can open."""
    here = [
        p
        for folder in ("src", "tests", "docs", "bench")
        for p in (ROOT / folder).rglob("*")
        if p.suffix in (".py", ".md")
        and not any(part.startswith(".venv") for part in p.parts)
        and p.name != "test_docs.py"
    ]
    citing = [str(p.relative_to(ROOT)) for p in here if re.search(r"\bSPEC\b|SPEC\.md|\.\./shared", p.read_text())]
    assert not citing


def test_the_speed_of_light_pages_device_table_is_generated_from_the_table():
    from rlprof.frameworks.devices import device_table

    page = (ROOT / "docs" / "speed_of_light.md").read_text()
    block = re.search(
        r"<!-- generated: python3 -m rlprof.frameworks.devices.*? -->\n(.*?)<!-- end of generated -->", page, re.S
    )
    assert block and block.group(1) == device_table(), (
        "docs/speed_of_light.md's device table is out of date: paste `python3 -m rlprof.frameworks.devices` there"
    )


def test_the_tracker_keys_are_named_once_in_the_verl_guide():
    """docs/verl.md's table lists exactly the keys `analyze/over_time/step_measures.py` writes (KEYS), each once."""
    from rlprof.analyze.over_time.step_measures import KEYS

    section = (ROOT / "docs" / "verl.md").read_text().split("### rlprof's measures in verl's loggers")[1]
    listed = re.findall(r"^\| `(rlprof/[^`]+)` \|", section.split("\n### ")[0], re.M)
    assert sorted(listed) == sorted(KEYS) and len(listed) == len(set(listed))
    others = [p for p in PAGES if p.name != "verl.md"]
    assert not [p.name for p in others if re.search(r"^\| `rlprof/", p.read_text(), re.M)], "one table, in verl.md"
