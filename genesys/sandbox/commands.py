"""`genesys sandbox build` and `genesys sandbox check`."""

from __future__ import annotations

from rich.console import Console

from genesys.sandbox.backends import check_backend
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
    usable = False
    rows = []
    with Console(stderr=True).status("trying each backend"):
        reports = [check_backend(kind, image=image) for kind in ("docker", "bwrap", "subprocess")]
    for report in reports:
        languages = ", ".join(
            language if outcome == "ok" else f"[red]{language} ({outcome})[/red]"
            for language, outcome in report.languages.items()
        )
        works = report.available and any(outcome == "ok" for outcome in report.languages.values())
        usable = usable or (works and report.backend != "subprocess")
        note = report.note + (" (not a sandbox)" if report.backend == "subprocess" else "")
        rows.append(
            (
                report.backend,
                "[green]yes[/green]" if works else "[red]no[/red]",
                languages or "-",
                note.strip(),
            )
        )
    print_table("genesys sandboxes", ("backend", "works", "languages", "note"), rows)
    return 0 if usable else 1
