"""MkDocs hooks (mkdocs.yml ``hooks:``) so that docs/ reads the same on the site as in the repository:

- a link to a folder (``[raw figures](benchmarks/)``) becomes a link to a generated page that lists the folder's files
  (MkDocs only links to files);
- a link that leaves docs/ (``[scripts](../benchmarks/)``, ``../benchmarks/common.py``) points to a copy of that
  repository file (or a listing of that folder) under ``repository/`` on the site.

A link whose target does not exist is left for MkDocs to report, so ``mkdocs build --strict`` still fails on it.
"""

from __future__ import annotations

import logging
import pathlib
import posixpath
import re
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel

log = logging.getLogger("mkdocs.hooks.links")

# [text](target) or [text](target "title"), not images' sizes nor external or in-page links.
LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?(?:\s+\"[^\"]*\")?\))")
REPOSITORY = "repository"  # where files from outside docs/ go on the site


def _external(target: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*:", target)) or target.startswith("/")


def _listing(title: str, folder: pathlib.Path) -> str:
    lines = [f"# {title}", "", "The files of this folder:", ""]
    for path in sorted(folder.iterdir()):
        if path.name.startswith((".", "__pycache__")):
            continue
        name = path.name + ("/" if path.is_dir() else "")
        lines.append(f"- [{name}]({path.name}/index.md)" if path.is_dir() else f"- [{name}]({path.name})")
    return "\n".join(lines) + "\n"


def _outside_targets(config: Any) -> set[str]:
    """Repository paths (relative to the repository root) that the pages link to outside docs/."""
    docs = pathlib.Path(config["docs_dir"]).resolve()
    root = docs.parent
    targets = set()
    for page in docs.rglob("*.md"):
        for match in LINK.finditer(page.read_text(encoding="utf-8")):
            target = match.group(2)
            if _external(target):
                continue
            resolved = (page.parent / target).resolve()
            if not resolved.is_relative_to(docs) and resolved.is_relative_to(root) and resolved.exists():
                targets.add(resolved.relative_to(root).as_posix())
    return targets


def on_files(files: Files, config: Any) -> Files:
    docs = pathlib.Path(config["docs_dir"]).resolve()
    root = docs.parent
    # A listing page for every folder of docs/ that has no index.md.
    for folder in [path for path in docs.rglob("*") if path.is_dir() and not (path / "index.md").exists()]:
        uri = folder.relative_to(docs).as_posix() + "/index.md"
        files.append(File.generated(config, uri, content=_listing(folder.relative_to(docs).as_posix() + "/", folder),
                                    inclusion=InclusionLevel.NOT_IN_NAV))
    # Copies of the repository files (and listings of the folders) that pages link to outside docs/.
    for target in sorted(_outside_targets(config)):
        path = root / target
        copies = [path] if path.is_file() else [p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")]
        for source in copies:
            uri = f"{REPOSITORY}/{source.relative_to(root).as_posix()}"
            if files.get_file_from_path(uri) is None:
                files.append(File.generated(config, uri, abs_src_path=str(source)))
        if path.is_dir():
            files.append(File.generated(config, f"{REPOSITORY}/{target}/index.md",
                                        content=_listing(f"{target}/ (in the repository)", path),
                                        inclusion=InclusionLevel.NOT_IN_NAV))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    docs = pathlib.Path(config["docs_dir"]).resolve()
    root = docs.parent
    page_folder = (docs / page.file.src_uri).parent

    def rewrite(match: re.Match[str]) -> str:
        target = match.group(2)
        if _external(target) or target.endswith(".md"):
            return match.group(0)
        resolved = (page_folder / target).resolve()
        if not resolved.exists():
            return match.group(0)  # MkDocs reports it
        if resolved.is_relative_to(docs):
            site_path = resolved
        elif resolved.is_relative_to(root):
            site_path = docs / REPOSITORY / resolved.relative_to(root)
        else:
            return match.group(0)
        new = posixpath.relpath(site_path.as_posix(), page_folder.as_posix())
        if resolved.is_dir():
            new = posixpath.join(new, "index.md")
        return match.group(1) + new + match.group(3)

    return LINK.sub(rewrite, markdown)
