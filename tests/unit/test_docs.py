"""The user's documents tell the truth about themselves: every relative link in README.md,
docs/ and compose/README.md leads to a file (and a heading) that exists, and every config
example in them loads as the gateway loads a config file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gateway.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "compose" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", path.read_text(), re.M)}


def _links() -> list[tuple[Path, str]]:
    out = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if not re.match(r"[a-z]+:", target):
                out.append((doc, target))
    return out


def test_there_are_links_to_check() -> None:
    assert len(_links()) > 20


@pytest.mark.parametrize(("doc", "target"), _links(), ids=lambda v: str(v).rsplit("/", 1)[-1])
def test_every_relative_link_resolves(doc: Path, target: str) -> None:
    path, _, anchor = target.partition("#")
    dest = (doc.parent / path).resolve() if path else doc
    assert dest.exists(), f"{doc.relative_to(ROOT)} links to {target}, which does not exist"
    assert ROOT in dest.parents or dest == ROOT, f"{doc.relative_to(ROOT)} links outside the repository: {target}"
    if anchor and dest.suffix == ".md":
        assert anchor in _anchors(dest), f"{doc.relative_to(ROOT)}: no heading #{anchor} in {dest.name}"


def _examples() -> list[tuple[str, str]]:
    return [(f"{doc.relative_to(ROOT)}#{i}", block) for doc in DOCS
            for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S))]


def test_there_are_config_examples() -> None:
    assert len(_examples()) >= 3


@pytest.mark.parametrize(("where", "block"), _examples(), ids=lambda v: v if "#" in v else "")
def test_every_config_example_loads(where: str, block: str) -> None:
    raw = yaml.safe_load(block)
    config = parse_config(raw)
    for user in raw.get("users", []):  # every user an example gives a password can log in
        if "password" in user:
            assert config.users.authenticate("PLAIN", f"\x00{user['name']}\x00{user['password']}",
                                             from_loopback=True).name == user["name"], where
