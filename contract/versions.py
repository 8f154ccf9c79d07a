"""The installed dependencies against the versions this project declares (and CI tests).

The lower bounds in pyproject.toml are the oldest versions the test matrix runs
(docs/versions.md), so a version outside them is one nothing has tested: a run still
goes ahead, with a one-line warning and the finding in its metadata
(`version_warnings`).  The bounds are read from the installed package's metadata
(`importlib.metadata.requires`), falling back to pyproject.toml when the project runs
from a checkout that was never installed: one source of truth, never a copy here.
"""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

DISTRIBUTION = "gpubench"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"  # contract/ is at the root


@dataclass(frozen=True)
class VersionProblem:
    """One installed package outside its declared range."""

    package: str
    installed: str
    declared: str  # the specifier as declared, e.g. ">=2.11"

    def __str__(self) -> str:
        return f"{self.package} {self.installed} is outside {self.package}{self.declared}"


def _pyproject_requirements(path: Path) -> list[str]:
    try:
        import tomllib
    except ImportError:  # Python 3.10: no TOML reader in the standard library
        return []
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return []
    deps = doc.get("project", {}).get("dependencies", [])
    return [d for d in deps if isinstance(d, str)]


def declared_requirements(distribution: str = DISTRIBUTION,
                          pyproject: Path = PYPROJECT) -> list[Requirement]:
    """The project's own dependencies (no extras) whose markers hold on this machine."""
    try:
        lines = md.requires(distribution) or []
    except md.PackageNotFoundError:
        lines = _pyproject_requirements(pyproject)
    env = {**default_environment(), "extra": ""}
    reqs = []
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        # An extra's requirement carries `extra == "..."`, false with extra "": skipped.
        if req.marker is None or req.marker.evaluate(env):
            reqs.append(req)
    return reqs


def installed_version(package: str) -> str | None:
    """The installed distribution's version, None when it is not installed."""
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return None


def check_versions(requirements: list[Requirement] | None = None,
                   version_of: Callable[[str], str | None] | None = None,
                   ) -> list[VersionProblem]:
    """Every declared dependency (default: declared_requirements()) that is installed
    (default: installed_version) at a version outside its specifier.  A missing package
    is not reported here: importing it fails louder."""
    reqs = declared_requirements() if requirements is None else requirements
    version_of = version_of or installed_version
    problems = []
    for req in reqs:
        if not req.specifier:
            continue
        have = version_of(req.name)
        if have is None:
            continue
        try:
            # prereleases: a nightly (2.12.0.dev...) of a version in range is in range.
            ok = req.specifier.contains(Version(have), prereleases=True)
        except InvalidVersion:
            ok = False
        if not ok:
            problems.append(VersionProblem(req.name, have, str(req.specifier)))
    return problems


def warning_line(problems: list[VersionProblem]) -> str | None:
    """The one-line warning a run prints for its problems, None when there are none."""
    if not problems:
        return None
    return ("; ".join(str(p) for p in problems)
            + ": a version CI does not test (docs/versions.md); results may differ")
