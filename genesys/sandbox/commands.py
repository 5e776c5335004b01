"""`genesys sandbox build` and `genesys sandbox check`."""

from __future__ import annotations

from rich.console import Console

from genesys.sandbox.backends import BackendCheck, check_backend
from genesys.sandbox.base import SandboxUnavailable
from genesys.ui.tables import print_table


def build(
    mode: str = "auto",
    tag: str | None = None,
    languages: list[str] | None = None,
    python: str | None = None,
    force: bool = False,
) -> int:
    """Build the sandbox image; `mode` is auto (online when a registry answers), online or offline."""
    from genesys.sandbox import image
    from genesys.sandbox.docker_backend import DEFAULT_IMAGE
    from genesys.sandbox.toolchains import ToolchainError

    console = Console(stderr=True)
    tag = tag or DEFAULT_IMAGE
    try:
        with console.status("preparing") as status:
            if mode == "auto":
                status.update(f"checking whether {image.ONLINE_BASE} can be pulled")
                mode = "online" if image.registry_reachable() else "offline"
            if mode == "online":
                report = image.build_online(tag, progress=status.update)
            else:
                report = image.build_offline(
                    tag, languages=languages, python=python, force=force, progress=status.update
                )
    except (SandboxUnavailable, ToolchainError) as exc:
        console.print(f"[red]genesys sandbox build: {exc}[/red]")
        return 1
    verb = "is up to date" if report.mode == "cached" else f"built ({report.mode})"
    console.print(f"{report.tag} {verb}: {report.size_mb:.0f} MB, languages: {', '.join(report.languages)}")
    for language, why in report.missing.items():
        console.print(f"  [yellow]{language} left out: {why}[/yellow]")
    return 0


def check(image: str | None = None) -> int:
    """Print which backends and languages work here; exit 1 when no real sandbox works."""
    with Console(stderr=True).status("trying each backend"):
        reports = [check_backend(kind, image=image) for kind in ("docker", "bwrap", "subprocess")]
    print_table("genesys sandboxes", ("backend", "works", "languages", "note"), check_rows(reports))
    usable = any(works(report) != "no" and report.backend != "subprocess" for report in reports)
    return 0 if usable else 1


def works(report: BackendCheck) -> str:
    """ "yes" when every language the backend offers ran its probe, "partly" when some did, else "no"."""
    outcomes = list(report.languages.values())
    passed = sum(outcome == "ok" for outcome in outcomes)
    if not report.available or not passed:
        return "no"
    return "yes" if passed == len(outcomes) else "partly"


def check_rows(reports: list[BackendCheck]) -> list[tuple[str, str, str, str]]:
    """One table row per backend: whether it works, its languages (the failing ones with why), a note."""
    colours = {"yes": "green", "partly": "yellow", "no": "red"}
    rows = []
    for report in reports:
        working = [language for language, outcome in report.languages.items() if outcome == "ok"]
        failing = [
            f"{language}: {outcome}" for language, outcome in report.languages.items() if outcome != "ok"
        ]
        languages = ", ".join(working) or "-"
        if failing:
            languages += "\n[red]not working: " + "; ".join(failing) + "[/red]"
        verdict = works(report)
        note = report.note + (" (not a sandbox)" if report.backend == "subprocess" else "")
        rows.append(
            (report.backend, f"[{colours[verdict]}]{verdict}[/{colours[verdict]}]", languages, note.strip())
        )
    return rows
