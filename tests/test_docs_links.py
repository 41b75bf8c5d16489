"""Every relative link in README.md and docs/ leads somewhere: the file exists and, where the
link names an anchor in a Markdown file, that file has a heading with that anchor (GitHub's
rule: lower case, punctuation dropped, spaces to hyphens, repeats numbered)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")), REPO_ROOT / "plans" / "README.md"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)


def slug(heading: str) -> str:
    text = re.sub(r"[`*_]|<[^>]+>", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", markdown).splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(markdown: str) -> list[str]:
    return [target for target in LINK.findall(FENCE.sub("", markdown)) if not re.match(r"[a-z]+:", target)]


def broken_links(source: Path) -> list[str]:
    problems = []
    text = source.read_text(encoding="utf-8")
    for target in links(text):
        path_part, _, anchor = target.partition("#")
        path = (source.parent / path_part).resolve() if path_part else source
        where = f"{source.parent.name}/{source.name}: {target}"
        if not path.exists():
            problems.append(f"{where}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path.read_text(encoding="utf-8")):
            problems.append(f"{where}: no heading with that anchor")
    return problems


def test_the_slug_rule() -> None:
    assert (
        slug("The LoRA worker: what it trains and what it reports")
        == "the-lora-worker-what-it-trains-and-what-it-reports"
    )
    assert slug("`--json` shapes") == "--json-shapes"
    assert anchors("# A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1"}


def test_the_checker_finds_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Top\n[ok](#top) [gone](missing.md) [bad](#nowhere) [web](https://x.org/y)\n")
    assert links(page.read_text()) == ["#top", "missing.md", "#nowhere"]
    assert [problem.split(": ", 1)[1] for problem in broken_links(page)] == [
        "missing.md: no such file", "#nowhere: no heading with that anchor"]


def test_every_relative_link_in_readme_and_docs_resolves() -> None:
    assert len(DOCS) >= 12
    problems = [problem for source in DOCS for problem in broken_links(source)]
    assert problems == []
    assert sum(len(links(source.read_text(encoding="utf-8"))) for source in DOCS) >= 20
