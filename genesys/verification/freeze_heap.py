"""Imported last by the fork server (see `genesys.verification.fork_server`): freezes what its
preload built, so that the garbage collector of the workers forked from it never walks those objects
(copying every page it touches) and the server's own exit does not either."""

import gc

gc.freeze()
