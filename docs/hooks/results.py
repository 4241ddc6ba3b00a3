"""mkdocs hook: the run outputs under results/ (reports and figures) become part of the site, so that the results
pages link to them where they live instead of to copies."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

SHOWN = {".md", ".png"}


def on_files(files, config):
    root = Path(config.config_file_path).parent
    for path in sorted((root / "results").rglob("*")):
        # a study's README links its JSON records (plan, paired differences, decision) beside it
        linked = path.suffix == ".json" and (path.parent / "README.md").is_file()
        if (path.suffix in SHOWN or linked) and path.is_file() and "checkpoint" not in path.parts:
            files.append(File(path.relative_to(root).as_posix(), src_dir=str(root), dest_dir=config.site_dir,
                              use_directory_urls=config.use_directory_urls, inclusion=InclusionLevel.NOT_IN_NAV))
    return files
