"""`genesys pipeline-stage`: serve one stage of a `--backend pipeline` run from this machine."""

from __future__ import annotations

import click


@click.command(
    "pipeline-stage",
    short_help="serve one stage of a pipeline-parallel generation run (genesys generate --backend pipeline)",
    help="Listen at --listen for the previous stage of a pipeline ring, load the layers the run's first stage "
    "assigns (only those: the model's safetensors files must be readable here under the same name or path), "
    "and serve steps until the run ends. Start one per machine with the same GENESYS_PIPELINE_SECRET in the "
    "environment (at least 32 characters; a connection that does not prove it knows the secret is refused), "
    "then run `genesys generate --backend pipeline --backend_options.stages N --backend_options.peers "
    "HOST:PORT,...` naming them in ring order. Messages are authenticated, not encrypted: use a tunnel when "
    "activations must stay private.",
)
@click.option(
    "--listen", default="127.0.0.1:0", show_default=True, help="HOST:PORT to listen at (port 0: any)"
)
@click.option("--device", help="torch device (default: the run's --device, else cuda when available)")
@click.option("--threads", type=click.IntRange(min=1), help="torch CPU threads")
def command(listen: str, device: str | None, threads: int | None) -> int:
    from genesys.inference.stage import serve

    return serve(listen, device, threads)
