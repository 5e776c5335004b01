"""Ray, the engine that places, supervises and restarts genesys's actors (`[cluster] backend = "ray"`).

- `session`: joining or starting Ray for a run (`ray_session`), the environment actors inherit, and
  what one actor is started with (`actor_options`), Ray's restart policy included;
- `pool`: `ActorPool`, the one supervised pool of actors: Ray restarts a dead actor and sends its
  calls again; the pool spreads calls by load, collects results and notices restarts;
- `generation`: `GenerationActor`, a generation backend in an actor, for `genesys generate` and for
  training's rollout workers (which also take new weights in place);
- `weights`: the trainer's weights published once into Ray's object store, checked on arrival.

The pools of the commands build on these: `genesys.generate.ray_backend` (a backend over generation
actors), `genesys.verification.ray_pool` (a verification pool over engine actors) and
`genesys.train.sources.asynchronous` (rollout workers). This package knows no backend and no
verifier; the names below are gathered for callers outside it.
"""

from genesys.cluster.session import (
    FORWARDED_ENV,
    FORWARDED_PREFIX,
    NAMESPACE,
    actor_options,
    forwarded_environment,
    import_ray,
    ray_session,
)

__all__ = [
    "FORWARDED_ENV",
    "FORWARDED_PREFIX",
    "NAMESPACE",
    "actor_options",
    "forwarded_environment",
    "import_ray",
    "ray_session",
]
