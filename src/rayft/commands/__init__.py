"""The `rayft` verbs, one module per verb group; :mod:`rayft.cli` builds the app from them."""
