"""Built-in verifier plugins, registered through the `genesys` entry-point group."""
