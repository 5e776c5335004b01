"""`genesys tasks` and `genesys plugins`: what is installed."""

from __future__ import annotations

import click


@click.command("tasks", help="list the named task sets `genesys generate --tasks` accepts")
def tasks() -> int:
    from genesys.plugins.registry import task_sets
    from genesys.ui.tables import print_table

    rows = [(name, task_set.description or "-") for name, task_set in sorted(task_sets().items())]
    print_table("genesys task sets (--tasks NAME[:key=value,...])", ("name", "description"), rows)
    return 0


@click.command(
    "plugins", help="list installed plugins, the task types they serve, and those broken or looking wrong"
)
def plugins() -> int:
    from genesys.plugins.registry import plugin_infos
    from genesys.ui.tables import print_table

    rows = [
        (i.name, i.version or "-", i.origin, ", ".join(i.task_types) or "-", i.status) for i in plugin_infos()
    ]
    print_table("genesys plugins", ("plugin", "version", "from", "task types", "status"), rows)
    return 0
